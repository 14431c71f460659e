-- A pipeline that never halts (issue 16, point 9): how often the worker
-- tried to broadcast a transfer without a settled answer (counted once per
-- block, the last one in attempt_height), and when it gave up on it (set
-- aside for the operator; the worker skips it from then on).
ALTER TABLE transfers ADD COLUMN broadcast_attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE transfers ADD COLUMN attempt_height BIGINT;
ALTER TABLE transfers ADD COLUMN set_aside_at BIGINT;
-- Money the ledger had recorded but the chain took back: a payout rebuilt
-- without an input that no longer exists, or an output spent by a
-- transaction the service does not know, records the value here, so the
-- conservation check (GET /admin/ledger) still balances.
CREATE TABLE ledger_corrections (
    id BIGSERIAL PRIMARY KEY,
    at BIGINT NOT NULL,
    round_id BIGINT,
    transfer_id BIGINT,
    txid TEXT NOT NULL,
    vout BIGINT NOT NULL,
    amount_sats BIGINT NOT NULL,
    reason TEXT NOT NULL
);
-- Money the chain took back (point 10): what a user spent out of a deposit
-- that was reorganised out for good. Shown as a negative balance; bets and
-- withdrawals are refused until the user's coins cover it.
ALTER TABLE users ADD COLUMN debt_sats BIGINT NOT NULL DEFAULT 0;
