-- tests/bench/scale_load.sql - N retained keys for tests/bench/scale.sh,
-- made in one statement by the server (generate_series), never row by row.
--   psql -v n=10000000 -v queue=scale -v retention_h=720 -v expired_pct=10 -f ...
--
-- The rows look like thirty days of a busy queue: keys are random UUIDs
-- (what producers send, and the worst case for the primary key's B-tree),
-- inserted in time order as a live table is, with created_at and
-- updated_at spread evenly over the retention and a further expired_pct
-- percent of it, so that share of the keys is expired; one key in a
-- thousand failed, with an error. Into an empty table the primary key is
-- dropped before and rebuilt after (a sorted build, minutes faster than
-- 10 M random inserts), as is every other index of the table: the loader
-- leaves the indexes the migrations made, whatever they are. One
-- transaction: a load cut short leaves the table as it was. Triggers are
-- off for the load (session_replication_role): sql/018's deferred check
-- that a completed key has no tombstone would queue one event per row
-- and take an advisory lock for each at COMMIT, and these keys never had
-- one; so the failed keys are counted after (sql/029's
-- sekali.recount_failed_keys(), where it exists). VACUUM ANALYZE the table
-- after (scale.sh does).
-- Where sekali.finished_keys exists (sql/040), the completed keys older
-- than the janitor's archive_after of an hour go there, as its moves leave
-- them, each with a random key_id (what sekali.key_id() makes of a random
-- key); the failed keys and the last hour's stay in idempotency_keys.
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL synchronous_commit = off;
SET LOCAL maintenance_work_mem = '512MB';
SET LOCAL session_replication_role = replica;
SELECT to_regclass('sekali.finished_keys') IS NOT NULL AS archive \gset
CREATE TEMP TABLE scale_indexes AS
    SELECT indrelid::regclass::text AS tab, indexrelid::regclass::text AS name,
           pg_get_indexdef(indexrelid) AS def, conname
      FROM pg_index LEFT JOIN pg_constraint ON conindid = indexrelid AND contype = 'p'
     WHERE indrelid = 'sekali.idempotency_keys'::regclass
       AND NOT EXISTS (SELECT 1 FROM sekali.idempotency_keys);
\if :archive
INSERT INTO scale_indexes
    SELECT indrelid::regclass::text, indexrelid::regclass::text, pg_get_indexdef(indexrelid),
           conname
      FROM pg_index LEFT JOIN pg_constraint ON conindid = indexrelid AND contype = 'p'
     WHERE indrelid = 'sekali.finished_keys'::regclass
       AND NOT EXISTS (SELECT 1 FROM sekali.finished_keys);
\endif
SELECT format('ALTER TABLE %s DROP CONSTRAINT %s', tab, conname)
  FROM scale_indexes WHERE conname IS NOT NULL \gexec
SELECT format('DROP INDEX %s', name) FROM scale_indexes WHERE conname IS NULL \gexec
CREATE TEMP VIEW scale_keys AS
    SELECT i, t, i % 1000 = 0 AS failed,
           :'archive'::boolean AND i % 1000 <> 0 AND t < now() - interval '1 hour' AS archived
      FROM (SELECT i, now() - make_interval(hours => :retention_h)
                      * (1 + :expired_pct / 100.0) * (1 - i::float8 / :n) AS t
              FROM generate_series(1, :n) i) s;
INSERT INTO sekali.idempotency_keys
       (queue, key, status, fence, owner, attempts, job_id, job_type, error,
        created_at, updated_at, completed_at)
SELECT :'queue', gen_random_uuid()::text,
       CASE WHEN failed THEN 'failed' ELSE 'completed' END,
       1, 'loader:1', 1, gen_random_uuid()::text, 'bench',
       CASE WHEN failed THEN 'handler said FAIL: bench' END, t, t,
       CASE WHEN failed THEN NULL ELSE t END
  FROM scale_keys WHERE NOT archived;
\if :archive
INSERT INTO sekali.finished_keys (queue, key_id, duplicates, completed_at, updated_at)
SELECT :'queue', gen_random_uuid(), 0, t, t FROM scale_keys WHERE archived;
\endif
SELECT format('ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (%s)', tab, conname,
              substring(def from '\((.*)\)$'))
  FROM scale_indexes WHERE conname IS NOT NULL \gexec
SELECT def FROM scale_indexes WHERE conname IS NULL \gexec
COMMIT;
SELECT to_regproc('sekali.recount_failed_keys') IS NOT NULL AS counted \gset
\if :counted
SELECT sekali.recount_failed_keys();
\endif
