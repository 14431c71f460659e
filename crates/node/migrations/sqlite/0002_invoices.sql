-- Invoices (issue 30): an R this node made for a payment to it. A row is paid once
-- `paid_channel` is set; the write that sets it happens before R leaves in a fulfill.
-- `settled` is set once that fulfill completed: until then a restart fulfils the paying
-- HTLC again, after it any HTLC for the invoice is failed.
CREATE TABLE invoices (
    label TEXT PRIMARY KEY,
    r_hash TEXT NOT NULL UNIQUE,
    r TEXT NOT NULL,
    amount_msat INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    paid_channel INTEGER,
    paid_msat INTEGER,
    paid_at INTEGER,
    settled INTEGER NOT NULL DEFAULT 0
);
