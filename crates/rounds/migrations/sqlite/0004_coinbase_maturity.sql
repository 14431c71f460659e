-- A deposit paid by a coinbase transaction cannot be spent before its 100th
-- confirmation (consensus), so it is credited at the larger of that and the
-- configured deposit confirmations. 0 for every other output.
ALTER TABLE outputs ADD COLUMN min_confirmations BIGINT NOT NULL DEFAULT 0;
ALTER TABLE transfers ADD COLUMN min_confirmations BIGINT NOT NULL DEFAULT 0;
