-- 035: the purges plan each call with its cutoff known (issue 44).
--
-- sql/034 made them read their time index in order, but as SQL functions
-- they were planned with parameters: the planner guessed that a third of
-- the table is older than "now() - $1", and on a table whose rows are out
-- of time order on disk (the outbox's rows are published by an update)
-- that guess made a scan and a sort cheaper than the index. A fresh CI
-- machine's outbox took that plan: a round with nothing expired read all
-- of its 10,601 rows. As PL/pgSQL with plan_cache_mode force_custom_plan,
-- each statement is planned with the retention and the batch as values;
-- the planner then asks the index for the oldest row, sees that nothing
-- (or how much) is older than the cutoff, and reads the index in order.
-- A plan per janitor batch costs well under a millisecond. Same results,
-- same signatures; the bodies are those of sql/028, 023 and 034.

CREATE OR REPLACE FUNCTION sekali.purge_keys(p_queue text, p_retention_ms bigint,
                                             p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.idempotency_keys WHERE ctid IN (
            SELECT ctid FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status IN ('completed', 'failed', 'cancelled')
               AND updated_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             ORDER BY updated_at
             LIMIT p_batch)
        RETURNING queue, key),
    checkpoints AS (
        DELETE FROM sekali.checkpoints c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key),
    tombstones AS (
        DELETE FROM sekali.cancellations c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key)
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION sekali.purge_dead_letters(p_queue text, p_retention_ms bigint,
                                                     p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.dead_letters WHERE id IN (
            SELECT d.id FROM sekali.dead_letters d
             WHERE d.queue = p_queue
               AND d.failed_at < now() - make_interval(secs => p_retention_ms / 1000.0)
               AND NOT EXISTS (SELECT 1 FROM sekali.idempotency_keys k
                                WHERE k.queue = d.queue AND k.key = d.key
                                  AND k.status = 'failed')
             ORDER BY d.failed_at
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION sekali.purge_outbox(p_retention_ms bigint, p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.outbox WHERE ctid IN (
            SELECT ctid FROM sekali.outbox
             WHERE published_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             ORDER BY published_at
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION sekali.purge_dedupe(p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.job_dedupe WHERE ctid IN (
            SELECT ctid FROM sekali.job_dedupe
             WHERE least(released_at, expires_at) < now() - interval '1 hour'
             ORDER BY least(released_at, expires_at)
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION sekali.purge_crashes(p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.job_crashes WHERE ctid IN (
            SELECT ctid FROM sekali.job_crashes
             WHERE last_crash < now() - interval '1 day'
             ORDER BY last_crash
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;
