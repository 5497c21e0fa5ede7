-- tests/bench/scale_letters.sql - a dead letter for each failed key that
-- tests/bench/scale_load.sql made, for tests/bench/scale.sh's `dlq list`
-- and `dlq groups` at N (one key in a thousand: 10,000 letters at 10 M).
--   psql -v queue=scale -f ...
--
-- What thirty days of a queue's dead letters look like to the operator's
-- reads: a few failure groups (fingerprints) of very different sizes, most
-- letters in one, failure times spread as the keys' are, bodies of a few
-- hundred bytes. Triggers are off as in the key loader (the per-group
-- counts are rebuilt after by sql/029's sekali.recount_dead_letters()).
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL synchronous_commit = off;
SET LOCAL session_replication_role = replica;
INSERT INTO sekali.dead_letters
       (queue, key, job_id, job_type, reason, error, body, body_size, attempts,
        first_failure, failed_at, host, worker, origin)
SELECT k.queue, k.key, k.job_id, k.job_type, 'failed',
       CASE WHEN r < 0.9 THEN format('handler said FAIL: invoice %s was void', r)
            WHEN r < 0.99 THEN format('partner API answered 422 for order %s', r)
            ELSE format('constraint "orders_total_check" failed (%s)', r) END,
       convert_to(repeat('{"order": "x"}', 16), 'UTF8'), 224, 1,
       k.updated_at, k.updated_at, 'loader', 'loader:1', 'scale_letters.sql'
  FROM (SELECT queue, key, job_id, job_type, updated_at, random() AS r
          FROM sekali.idempotency_keys
         WHERE queue = :'queue' AND status = 'failed'
         ORDER BY updated_at) k;
COMMIT;
SELECT to_regproc('sekali.recount_dead_letters') IS NOT NULL AS counted \gset
\if :counted
SELECT sekali.recount_dead_letters();
\endif
ANALYZE sekali.dead_letters;
