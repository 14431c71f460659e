-- Initial schema. Usernames are unique as typed here; 0002 adds the
-- case-insensitive unique index once no case collisions exist.
-- Timestamps are unix seconds (UTC).
CREATE TABLE users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    username TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    token_version INTEGER NOT NULL DEFAULT 0,
    derivation_index INTEGER NOT NULL,
    address TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    CONSTRAINT users_derivation_index_key UNIQUE (derivation_index)
);

CREATE TABLE rounds (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    status TEXT NOT NULL,
    opened_at INTEGER NOT NULL,
    closes_at INTEGER NOT NULL,
    pot_sats INTEGER NOT NULL DEFAULT 0,
    bettors INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE bets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    round_id INTEGER NOT NULL REFERENCES rounds (id),
    user_id INTEGER NOT NULL REFERENCES users (id),
    amount_sats INTEGER NOT NULL,
    txid TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX bets_round_user ON bets (round_id, user_id);

CREATE TABLE service_config (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    fee_address TEXT NOT NULL,
    fee_rate_sat_vb INTEGER NOT NULL,
    round_duration_seconds INTEGER NOT NULL,
    min_bet_sats INTEGER NOT NULL,
    min_withdrawal_sats INTEGER NOT NULL,
    deposit_confirmations INTEGER NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    event TEXT NOT NULL,
    actor TEXT NOT NULL,
    diff TEXT NOT NULL,
    details TEXT NOT NULL
);

-- Hands out derivation indexes atomically (one row, incremented per
-- registration); the unique key on users.derivation_index stays the guard.
CREATE TABLE derivation_counter (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    next_index BIGINT NOT NULL
);
INSERT INTO derivation_counter (id, next_index) VALUES (1, 0);
