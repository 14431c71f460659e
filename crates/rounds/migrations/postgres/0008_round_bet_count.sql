-- The number of placed bets of a round, kept beside pot_sats by the same
-- statements: a bet is refused once its round holds MAX_ROUND_BETS, so that
-- the payout, which spends every pot output in one transaction, stays under
-- the standard transaction weight (docs/rounds-engine.md, "Bets").
ALTER TABLE rounds ADD COLUMN bet_count BIGINT NOT NULL DEFAULT 0;
UPDATE rounds SET bet_count = (
    SELECT COUNT(*) FROM bets WHERE bets.round_id = rounds.id AND bets.status = 'placed'
);
