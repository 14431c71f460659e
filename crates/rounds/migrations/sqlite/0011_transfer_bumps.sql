-- Fee bumping (issue 31): a withdrawal or payout that stays unconfirmed is
-- replaced (BIP125) by a new version, a transfer row of its own written
-- before its broadcast. bump_of names the first version of the family on
-- every later one, replaces the version it replaced; the version that lost the race is 'superseded' and its
-- outputs are marked spent by 'superseded' (they exist in no block), so a
-- family debits and credits the ledger once, through its live version.
-- sent_height is the synced tip when this version was first seen waiting
-- (the blocks it stayed unconfirmed are counted from it).
ALTER TABLE transfers ADD COLUMN bump_of BIGINT;
ALTER TABLE transfers ADD COLUMN replaces BIGINT;
ALTER TABLE transfers ADD COLUMN sent_height BIGINT;
CREATE INDEX transfers_bump_of ON transfers (bump_of);
-- One live payout per round: the superseded versions stay beside it.
DROP INDEX transfers_one_payout;
CREATE UNIQUE INDEX transfers_one_payout ON transfers (round_id) WHERE kind = 'payout' AND status <> 'superseded';
