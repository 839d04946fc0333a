-- WAL per key by record type (BENCHMARKS.md, Postgres commit gate): 2,000
-- transactions of each kind, interleaved, each the effect's INSERT and
-- either the hand-written keys row (keyed by a counter, as pgbench's
-- anchor, or by a random UUID, as clients send Idempotency-Key) or the
-- gate's completion row (schema version 4, a 22-character digest); the
-- records of those transactions' xids only, so other sessions' writes do
-- not count. Run it in a scratch database (it creates pg_walinspect there):
--   createdb walcost && psql -d walcost -f wal.sql && dropdb walcost
\set ON_ERROR_STOP 1
CREATE EXTENSION IF NOT EXISTS pg_walinspect;
DROP TABLE IF EXISTS eff, hc, hu, g;
CREATE TABLE eff (id bigint NOT NULL);
CREATE TABLE hc (key text PRIMARY KEY, fingerprint bytea NOT NULL, response bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE hu (key text PRIMARY KEY, fingerprint bytea NOT NULL, response bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE g (digest text NOT NULL PRIMARY KEY, fingerprint bytea NOT NULL, fence bigint NOT NULL, result bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(), expires_at timestamptz NOT NULL, relayed boolean NOT NULL DEFAULT false, progress jsonb);
CREATE INDEX g_created_at ON g (created_at); CREATE INDEX g_unfinished ON g (created_at) WHERE progress IS NOT NULL;
CREATE TEMP TABLE xids (kind text, xid xid8);
SELECT pg_current_wal_insert_lsn() AS s \gset
DO $$ DECLARE a xid8[] := '{}'; b xid8[] := '{}'; c xid8[] := '{}'; BEGIN
FOR i IN 1..2000 LOOP
  INSERT INTO eff VALUES (i); INSERT INTO hc (key, fingerprint, response) VALUES ('bench/' || (1000000+i), '', 'ok');
  a := a || pg_current_xact_id(); COMMIT;
  INSERT INTO eff VALUES (i); INSERT INTO hu (key, fingerprint, response) VALUES (gen_random_uuid()::text, '', 'ok');
  b := b || pg_current_xact_id(); COMMIT;
  INSERT INTO eff VALUES (i); INSERT INTO g (digest, fingerprint, fence, result, created_at, expires_at) VALUES (substr(encode(sha256(i::text::bytea),'base64'),1,22), '', 1700000000000000+i, '\x01026f6b', clock_timestamp(), now()+interval '1 day');
  c := c || pg_current_xact_id(); COMMIT;
END LOOP;
INSERT INTO xids SELECT 'counter', unnest(a); INSERT INTO xids SELECT 'uuid', unnest(b); INSERT INTO xids SELECT 'gate', unnest(c);
END $$;
SELECT x.kind, w.resource_manager || ' ' || split_part(w.record_type, ' ', 1) AS rec, round(sum(w.record_length)/2000.0, 1) AS b_per_key, sum(w.fpi_length) fpi
FROM pg_get_wal_records_info_till_end_of_wal(:'s') w JOIN xids x ON w.xid::text = (x.xid::text::bigint % 4294967296)::text
GROUP BY ROLLUP (1, 2) ORDER BY 1, 2;
