-- Forwards (issue 30): an incoming HTLC this node offered on to the next hop. The row is
-- written before the downstream offer leaves; its state moves to `fulfilled` (with R) or
-- `failed` before the upstream fulfil or routefail that depends on it leaves, so that a
-- restart settles the upstream HTLC as the downstream one ended.
CREATE TABLE forwards (
    in_channel INTEGER NOT NULL,
    r_hash TEXT NOT NULL,
    in_msat INTEGER NOT NULL,
    out_channel INTEGER NOT NULL,
    out_peer TEXT NOT NULL,
    out_msat INTEGER NOT NULL,
    out_expiry INTEGER NOT NULL,
    onion BLOB NOT NULL,
    state TEXT NOT NULL,
    r TEXT,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (in_channel, r_hash)
);
