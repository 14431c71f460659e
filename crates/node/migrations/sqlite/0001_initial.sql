-- The schema the node created before it had migrations (its schema string), kept as the
-- first migration. Every statement says IF NOT EXISTS: on a database made by that string
-- this migration changes nothing and is only recorded, so such databases open as before.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS peers (node_id TEXT PRIMARY KEY, address TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS channels (
    id INTEGER PRIMARY KEY,
    peer_id TEXT NOT NULL,
    snapshot TEXT NOT NULL,
    abandoned INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS outputs (
    txid TEXT NOT NULL, vout INTEGER NOT NULL, amount_sat INTEGER NOT NULL,
    branch INTEGER NOT NULL, idx INTEGER NOT NULL, height INTEGER NOT NULL,
    coinbase INTEGER NOT NULL DEFAULT 0, spent_by TEXT, PRIMARY KEY (txid, vout)
);
CREATE TABLE IF NOT EXISTS broadcasts (
    txid TEXT PRIMARY KEY, channel_id INTEGER NOT NULL, tx TEXT NOT NULL,
    csv_blocks INTEGER NOT NULL, lock_time INTEGER NOT NULL, done INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS block_hashes (height INTEGER PRIMARY KEY, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tx_blocks (txid TEXT PRIMARY KEY, height INTEGER NOT NULL, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS revoked_commitments (
    channel_id INTEGER NOT NULL, num INTEGER NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (channel_id, num)
);
CREATE TABLE IF NOT EXISTS revoked_for_tests (
    channel_id INTEGER NOT NULL, num INTEGER NOT NULL, tx TEXT NOT NULL,
    PRIMARY KEY (channel_id, num)
);
