-- Limits that hold for the whole service when several processes share one
-- PostgreSQL database (issue 18): the login throttle, the registration
-- quota and the per-IP stream cap keep their state here. SQLite (one
-- process) keeps them in memory; the tables exist there too so the store's
-- functions are tested on both backends. Times are unix milliseconds.

-- Login throttle: the failure record of each key ('u:' name, 'i:' address);
-- expires_ms is when it has fully decayed (the sweep removes it then).
CREATE TABLE throttle_failures (
    key TEXT PRIMARY KEY,
    failures BIGINT NOT NULL,
    last_failure_ms BIGINT NOT NULL,
    locked_until_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL
);
CREATE INDEX throttle_failures_expiry ON throttle_failures (expires_ms);
-- Attempts in flight (password being checked), one row per attempt and key;
-- the lease frees the reservation of a process that died mid-attempt.
CREATE TABLE throttle_attempts (
    attempt BIGINT NOT NULL,
    key TEXT NOT NULL,
    lease_until_ms BIGINT NOT NULL,
    PRIMARY KEY (attempt, key)
);
CREATE INDEX throttle_attempts_key ON throttle_attempts (key);
-- Registration quota: counted registrations (pending_until_ms NULL) and
-- registrations in progress (leased until pending_until_ms).
CREATE TABLE registration_slots (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ip TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    pending_until_ms BIGINT
);
CREATE INDEX registration_slots_ip ON registration_slots (ip, at_ms);
-- Open streams of every process; seq orders them (oldest first).
CREATE TABLE stream_slots (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    process TEXT NOT NULL,
    stream BIGINT NOT NULL,
    ip TEXT NOT NULL,
    UNIQUE (process, stream)
);
CREATE INDEX stream_slots_ip ON stream_slots (ip, seq);
-- Processes and their last heartbeat: the streams of a process not seen
-- for a while (killed) are removed.
CREATE TABLE service_processes (
    process TEXT PRIMARY KEY,
    seen_ms BIGINT NOT NULL
);
-- SQLite: a row to write first, so a limit transaction holds the write
-- lock before it reads (PostgreSQL uses advisory locks per key instead).
CREATE TABLE limits_lock (id BIGINT PRIMARY KEY);
INSERT INTO limits_lock (id) VALUES (1);
