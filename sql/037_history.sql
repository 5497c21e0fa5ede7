-- 037: each queue's outcomes per minute, kept for days (issue 39): the
-- console's charts of the last hours and days come from here, not from
-- the five minutes its sampler keeps in memory. The janitor of each
-- sekalid adds what its workers counted since its last round (shared
-- memory, never a statement per job) to the row of PostgreSQL's current
-- minute, so hosts add up in one row; and deletes rows older than
-- janitor.history_retention, reading the minute index in order.

CREATE TABLE IF NOT EXISTS sekali.history (
    queue          text        NOT NULL,
    minute         timestamptz NOT NULL,
    completed      bigint      NOT NULL DEFAULT 0,
    retried        bigint      NOT NULL DEFAULT 0,
    dead_lettered  bigint      NOT NULL DEFAULT 0,
    duplicates     bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute)
);

CREATE INDEX IF NOT EXISTS history_by_minute ON sekali.history (minute);

-- Adds one round's counts, one element per queue, to the current minute.
CREATE OR REPLACE FUNCTION sekali.add_history(p_queues text[], p_completed bigint[],
                                              p_retried bigint[], p_dead bigint[],
                                              p_duplicates bigint[])
RETURNS void LANGUAGE sql AS $$
    INSERT INTO sekali.history AS h (queue, minute, completed, retried, dead_lettered,
                                     duplicates)
    SELECT q, date_trunc('minute', now()), c, r, d, u
      FROM unnest(p_queues, p_completed, p_retried, p_dead, p_duplicates) AS t(q, c, r, d, u)
    ON CONFLICT (queue, minute) DO UPDATE
       SET completed = h.completed + excluded.completed,
           retried = h.retried + excluded.retried,
           dead_lettered = h.dead_lettered + excluded.dead_lettered,
           duplicates = h.duplicates + excluded.duplicates
$$;

-- Rows older than p_retention_ms, at most p_batch of them; planned with
-- the cutoff known, as sql/035 explains.
CREATE OR REPLACE FUNCTION sekali.purge_history(p_retention_ms bigint, p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.history WHERE ctid IN (
            SELECT ctid FROM sekali.history
             WHERE minute < now() - make_interval(secs => p_retention_ms / 1000.0)
             ORDER BY minute
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;
