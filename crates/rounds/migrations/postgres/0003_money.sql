-- Money: the draw columns of a round, outputs the service controls, every
-- transfer a user or round sees, and the blocks the chain watcher processed.
-- Invariants live in the schema: an output can be spent by one transaction
-- only (spent_txid is set by a conditional update), one payout per round
-- (unique index), one deposit row per output (unique index).
ALTER TABLE rounds ADD COLUMN tip_height_at_close BIGINT;
ALTER TABLE rounds ADD COLUMN bets_commitment TEXT;
ALTER TABLE rounds ADD COLUMN block_height BIGINT;
ALTER TABLE rounds ADD COLUMN block_hash TEXT;
ALTER TABLE rounds ADD COLUMN seed TEXT;
ALTER TABLE rounds ADD COLUMN ticket BIGINT;
ALTER TABLE rounds ADD COLUMN winner_bet_id BIGINT;
ALTER TABLE bets ADD COLUMN status TEXT NOT NULL DEFAULT 'placed';
ALTER TABLE bets ADD COLUMN fee_sats BIGINT NOT NULL DEFAULT 0;

CREATE TABLE transfers (
    id BIGSERIAL PRIMARY KEY,
    kind TEXT NOT NULL,
    user_id BIGINT REFERENCES users (id),
    round_id BIGINT REFERENCES rounds (id),
    txid TEXT NOT NULL,
    vout BIGINT NOT NULL DEFAULT -1,
    raw_tx TEXT,
    amount_sats BIGINT NOT NULL,
    fee_sats BIGINT NOT NULL DEFAULT 0,
    commission_sats BIGINT NOT NULL DEFAULT 0,
    address TEXT,
    status TEXT NOT NULL,
    block_height BIGINT,
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX transfers_one_payout ON transfers (round_id) WHERE kind = 'payout';
CREATE UNIQUE INDEX transfers_one_deposit ON transfers (txid, vout) WHERE kind = 'deposit';
CREATE INDEX transfers_user ON transfers (user_id, id);
CREATE INDEX transfers_txid ON transfers (txid);

CREATE TABLE outputs (
    id BIGSERIAL PRIMARY KEY,
    txid TEXT NOT NULL,
    vout BIGINT NOT NULL,
    amount_sats BIGINT NOT NULL,
    user_id BIGINT REFERENCES users (id),
    round_id BIGINT REFERENCES rounds (id),
    origin TEXT NOT NULL,
    block_height BIGINT,
    spent_txid TEXT,
    CONSTRAINT outputs_outpoint UNIQUE (txid, vout)
);
CREATE INDEX outputs_user ON outputs (user_id, spent_txid);
CREATE INDEX outputs_round ON outputs (round_id);
CREATE INDEX outputs_unconfirmed ON outputs (block_height);

CREATE TABLE blocks (
    height BIGINT PRIMARY KEY,
    hash TEXT NOT NULL
);
