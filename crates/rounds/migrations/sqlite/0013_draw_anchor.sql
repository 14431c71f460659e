-- The hash of the tip the engine read at a round's close: the draw block
-- must be its child, so that it was provably mined after the close (issue
-- 32). Rounds closed before this column existed have none and are drawn as
-- before (docs/rounds-engine.md, "The draw rule").
ALTER TABLE rounds ADD COLUMN tip_hash_at_close TEXT;
