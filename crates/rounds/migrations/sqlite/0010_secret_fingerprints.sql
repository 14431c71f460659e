-- One-way fingerprints of the secrets every process on this database must
-- share (the wallet seed, the session-token secret): the first process
-- records them, a process with other secrets refuses to start
-- (docs/rounds-api.md, "Secrets and file permissions").
CREATE TABLE secret_fingerprints (
    name TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    recorded_at INTEGER NOT NULL
);
