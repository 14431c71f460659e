-- Initial schema. Usernames are unique as typed here; 0002 adds the
-- case-insensitive unique index once no case collisions exist.
-- Timestamps are unix seconds (UTC).
CREATE TABLE users (
    id BIGSERIAL PRIMARY KEY,
    username TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    token_version BIGINT NOT NULL DEFAULT 0,
    derivation_index BIGINT NOT NULL,
    address TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    CONSTRAINT users_derivation_index_key UNIQUE (derivation_index)
);

CREATE TABLE rounds (
    id BIGSERIAL PRIMARY KEY,
    status TEXT NOT NULL,
    opened_at BIGINT NOT NULL,
    closes_at BIGINT NOT NULL,
    pot_sats BIGINT NOT NULL DEFAULT 0,
    bettors BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE bets (
    id BIGSERIAL PRIMARY KEY,
    round_id BIGINT NOT NULL REFERENCES rounds (id),
    user_id BIGINT NOT NULL REFERENCES users (id),
    amount_sats BIGINT NOT NULL,
    txid TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX bets_round_user ON bets (round_id, user_id);

CREATE TABLE service_config (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    fee_address TEXT NOT NULL,
    fee_rate_sat_vb BIGINT NOT NULL,
    round_duration_seconds BIGINT NOT NULL,
    min_bet_sats BIGINT NOT NULL,
    min_withdrawal_sats BIGINT NOT NULL,
    deposit_confirmations BIGINT NOT NULL,
    paused BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE audit_log (
    id BIGSERIAL PRIMARY KEY,
    at BIGINT NOT NULL,
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
