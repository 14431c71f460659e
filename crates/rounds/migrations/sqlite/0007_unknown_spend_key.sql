-- One `unknown_spend` audit entry per output, decided by the output's key
-- (a primary key that two workers cannot both insert) instead of by
-- comparing the stored JSON text of earlier entries, which any change to
-- the details' fields or their order would have defeated.
CREATE TABLE unknown_spends (
    txid TEXT NOT NULL,
    vout BIGINT NOT NULL,
    PRIMARY KEY (txid, vout)
);
INSERT OR IGNORE INTO unknown_spends (txid, vout)
SELECT json_extract(details, '$.txid'), json_extract(details, '$.vout')
FROM audit_log
WHERE event = 'unknown_spend'
  AND json_extract(details, '$.txid') IS NOT NULL
  AND json_extract(details, '$.vout') IS NOT NULL;
