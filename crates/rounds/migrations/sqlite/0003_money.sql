-- Money: the draw columns of a round, outputs the service controls, every
-- transfer a user or round sees, and the blocks the chain watcher processed.
-- Invariants live in the schema: an output can be spent by one transaction
-- only (spent_txid is set by a conditional update), one payout per round
-- (unique index), one deposit row per output (unique index).
ALTER TABLE rounds ADD COLUMN tip_height_at_close INTEGER;
ALTER TABLE rounds ADD COLUMN bets_commitment TEXT;
ALTER TABLE rounds ADD COLUMN block_height INTEGER;
ALTER TABLE rounds ADD COLUMN block_hash TEXT;
ALTER TABLE rounds ADD COLUMN seed TEXT;
ALTER TABLE rounds ADD COLUMN ticket INTEGER;
ALTER TABLE rounds ADD COLUMN winner_bet_id INTEGER;
ALTER TABLE bets ADD COLUMN status TEXT NOT NULL DEFAULT 'placed';
ALTER TABLE bets ADD COLUMN fee_sats INTEGER NOT NULL DEFAULT 0;

CREATE TABLE transfers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    user_id INTEGER REFERENCES users (id),
    round_id INTEGER REFERENCES rounds (id),
    txid TEXT NOT NULL,
    vout INTEGER NOT NULL DEFAULT -1,
    raw_tx TEXT,
    amount_sats INTEGER NOT NULL,
    fee_sats INTEGER NOT NULL DEFAULT 0,
    commission_sats INTEGER NOT NULL DEFAULT 0,
    address TEXT,
    status TEXT NOT NULL,
    block_height INTEGER,
    created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX transfers_one_payout ON transfers (round_id) WHERE kind = 'payout';
CREATE UNIQUE INDEX transfers_one_deposit ON transfers (txid, vout) WHERE kind = 'deposit';
CREATE INDEX transfers_user ON transfers (user_id, id);
CREATE INDEX transfers_txid ON transfers (txid);

CREATE TABLE outputs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    txid TEXT NOT NULL,
    vout INTEGER NOT NULL,
    amount_sats INTEGER NOT NULL,
    user_id INTEGER REFERENCES users (id),
    round_id INTEGER REFERENCES rounds (id),
    origin TEXT NOT NULL,
    block_height INTEGER,
    spent_txid TEXT,
    CONSTRAINT outputs_outpoint UNIQUE (txid, vout)
);
CREATE INDEX outputs_user ON outputs (user_id, spent_txid);
CREATE INDEX outputs_round ON outputs (round_id);
CREATE INDEX outputs_unconfirmed ON outputs (block_height);

CREATE TABLE blocks (
    height INTEGER PRIMARY KEY,
    hash TEXT NOT NULL
);
