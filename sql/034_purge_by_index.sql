-- 034: the purges of the outbox, the dedupe keys and the crash counts read
-- their time index in order (sql/033, and 006's job_crashes_by_time), so a
-- batch reads the rows it deletes and a round with nothing expired reads
-- one index page, however many rows are retained (issue 44). Same results,
-- same signatures. jit off, as in sql/028: a generic plan's estimates at
-- millions of rows would compile every batch.

-- Outbox rows published more than p_retention_ms ago; unpublished rows stay.
CREATE OR REPLACE FUNCTION sekali.purge_outbox(p_retention_ms bigint, p_batch integer)
RETURNS bigint LANGUAGE sql SET jit = off AS $$
    WITH gone AS (
        DELETE FROM sekali.outbox WHERE ctid IN (
            SELECT ctid FROM sekali.outbox
             WHERE published_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             ORDER BY published_at
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Dedupe keys released or expired more than an hour ago: for that hour a
-- released key still tells who held it, when asked. "released or expired
-- before t" is "the earlier of the two before t", the key of sql/033's
-- job_dedupe_done.
CREATE OR REPLACE FUNCTION sekali.purge_dedupe(p_batch integer)
RETURNS bigint LANGUAGE sql SET jit = off AS $$
    WITH gone AS (
        DELETE FROM sekali.job_dedupe WHERE ctid IN (
            SELECT ctid FROM sekali.job_dedupe
             WHERE least(released_at, expires_at) < now() - interval '1 hour'
             ORDER BY least(released_at, expires_at)
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Crash counts (sql/006) a day old: a crash loop crashes within minutes,
-- so a day-old count is history.
CREATE OR REPLACE FUNCTION sekali.purge_crashes(p_batch integer)
RETURNS bigint LANGUAGE sql SET jit = off AS $$
    WITH gone AS (
        DELETE FROM sekali.job_crashes WHERE ctid IN (
            SELECT ctid FROM sekali.job_crashes
             WHERE last_crash < now() - interval '1 day'
             ORDER BY last_crash
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;
