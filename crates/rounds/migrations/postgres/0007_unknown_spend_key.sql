-- One `unknown_spend` audit entry per output, decided by the output's key
-- (a primary key that two processes cannot both insert) instead of by
-- comparing the stored JSON text of earlier entries, which any change to
-- the details' fields or their order would have defeated, and which two
-- processes reading at the same moment could both miss.
CREATE TABLE unknown_spends (
    txid TEXT NOT NULL,
    vout BIGINT NOT NULL,
    PRIMARY KEY (txid, vout)
);
INSERT INTO unknown_spends (txid, vout)
SELECT details::jsonb ->> 'txid', (details::jsonb ->> 'vout')::BIGINT
FROM audit_log
WHERE event = 'unknown_spend'
  AND details::jsonb ->> 'txid' IS NOT NULL
  AND details::jsonb ->> 'vout' IS NOT NULL
ON CONFLICT DO NOTHING;
