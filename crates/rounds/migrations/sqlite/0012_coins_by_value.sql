-- A payment reads the payer's largest unspent coins first, a bounded
-- number of them (issue 32): this index serves that order without sorting
-- every coin the user holds.
CREATE INDEX outputs_unspent_by_value ON outputs (user_id, amount_sats) WHERE spent_txid IS NULL;
