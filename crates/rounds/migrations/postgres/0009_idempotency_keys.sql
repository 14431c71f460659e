-- Idempotency-Key of money requests (docs/rounds-api.md, "Idempotency"):
-- one row per user and key. `claim` is the token of the request holding an
-- unbound key; `transfer_id` binds the key to the payment, written in the
-- same transaction as the payment itself, so a key pays at most once.
CREATE TABLE idempotency_keys (
    user_id BIGINT NOT NULL REFERENCES users (id),
    idem_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    claim BIGINT NOT NULL,
    claimed_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    transfer_id BIGINT REFERENCES transfers (id),
    PRIMARY KEY (user_id, idem_key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (user_id, created_at);
