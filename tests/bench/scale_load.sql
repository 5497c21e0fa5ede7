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
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL synchronous_commit = off;
SET LOCAL maintenance_work_mem = '512MB';
SET LOCAL session_replication_role = replica;
CREATE TEMP TABLE scale_indexes AS
    SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS def,
           indisprimary AS primary_key
      FROM pg_index WHERE indrelid = 'sekali.idempotency_keys'::regclass
       AND NOT EXISTS (SELECT 1 FROM sekali.idempotency_keys);
SELECT count(*) > 0 AS indexes_rebuilt FROM scale_indexes \gset
\if :indexes_rebuilt
ALTER TABLE sekali.idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
SELECT format('DROP INDEX %s', name) FROM scale_indexes WHERE NOT primary_key \gexec
\endif
INSERT INTO sekali.idempotency_keys
       (queue, key, status, fence, owner, attempts, job_id, job_type, error,
        created_at, updated_at, completed_at)
SELECT :'queue', gen_random_uuid()::text,
       CASE WHEN i % 1000 = 0 THEN 'failed' ELSE 'completed' END,
       1, 'loader:1', 1, gen_random_uuid()::text, 'bench',
       CASE WHEN i % 1000 = 0 THEN 'handler said FAIL: bench' END, t, t,
       CASE WHEN i % 1000 = 0 THEN NULL ELSE t END
  FROM (SELECT i, now() - make_interval(hours => :retention_h)
                  * (1 + :expired_pct / 100.0) * (1 - i::float8 / :n) AS t
          FROM generate_series(1, :n) i) s;
\if :indexes_rebuilt
ALTER TABLE sekali.idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (queue, key);
SELECT def FROM scale_indexes WHERE NOT primary_key \gexec
\endif
COMMIT;
SELECT to_regproc('sekali.recount_failed_keys') IS NOT NULL AS counted \gset
\if :counted
SELECT sekali.recount_failed_keys();
\endif
