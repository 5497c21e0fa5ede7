-- 041: the archive's purge goes on from where its last batch ended (issue 44).
--
-- sekali.purge_finished_keys (sql/040) takes the oldest expired keys of a
-- queue through the expiry index, a batch at a time. The rows a batch
-- deletes leave their index entries behind until a VACUUM, and a table of
-- 100 M archived keys is vacuumed by autovacuum only once a fifth of it is
-- dead: every later batch walked the entries of every row deleted before
-- it. Measured on the 100 M-key benchmark store after one series of
-- purges (1.3 M rows deleted): a batch of 1,000 read 17,173 index pages,
-- 134 MB, more than the 128 MB of shared buffers, so that each batch
-- pushed the workers' pages out of them; the workers beside a purge lost
-- 22 % of their jobs/s at full pace and 34 % at a quarter of it.
--
-- This function starts where the caller says the last batch ended
-- (p_after, the newest updated_at it deleted; NULL from the start) and
-- answers where this one ended. Nothing older than that mark is left to
-- delete: a batch takes the oldest rows first, and rows only enter
-- sekali.finished_keys by the janitor's move, after the round's purges,
-- with an updated_at newer than the purge's cutoff (an expired key is
-- purged from the keys table before it could move). The janitor keeps the
-- mark for each queue between its rounds and forgets it when it starts
-- again; a row that did appear under a mark would only be kept longer
-- than its retention, which loses no guarantee. Rows at the mark itself
-- are read again (>=), so that ties split by a batch's LIMIT are not
-- passed by.

CREATE OR REPLACE FUNCTION sekali.purge_finished_keys_after(
    p_queue text, p_retention_ms bigint, p_batch integer, p_after timestamptz,
    OUT deleted bigint, OUT last_updated_at timestamptz)
LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    WITH gone AS (
        DELETE FROM sekali.finished_keys WHERE ctid IN (
            SELECT ctid FROM sekali.finished_keys
             WHERE queue = p_queue
               AND updated_at >= coalesce(p_after, '-infinity')
               AND updated_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             ORDER BY updated_at
             LIMIT p_batch)
        RETURNING updated_at)
    SELECT count(*), coalesce(max(updated_at), p_after) INTO deleted, last_updated_at FROM gone;
END
$$;
