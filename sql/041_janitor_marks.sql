-- 041: the janitor's moves and the archive's purge go on from where their
-- last batch ended (issue 44).
--
-- sekali.archive_keys and sekali.purge_finished_keys (sql/040) take the
-- oldest rows of a queue through a time index, a batch at a time, from
-- the start of it each time. Two kinds of entries pile up at that start:
-- the rows earlier batches deleted, whose index entries stay until a
-- VACUUM (which a table of 100 M archived keys gets only once a fifth of
-- it is dead), and, in the keys table's expiry index, the failed and
-- cancelled keys, which never move and stay for the whole retention.
-- Every batch walked them all again. Measured on the 100 M-key benchmark
-- store: after one series of purges (1.3 M rows deleted) a purge batch of
-- 1,000 read 17,173 index pages, 134 MB, more than the 128 MB of shared
-- buffers, so that each batch pushed the workers' pages out of them (the
-- workers beside a purge lost 22 % of their jobs/s at full pace and 34 %
-- at a quarter of it); a move batch read the keys table whole past its
-- 100,000 failed keys (5,749 pages, 123 ms, at every batch).
--
-- These functions start where the caller says the last batch ended
-- (p_after, the newest updated_at it took; NULL from the start) and answer
-- where this one ended. Nothing older than that mark is left for them: a
-- batch takes the oldest rows first; a row enters the archive only by a
-- move, after the round's purges, with an updated_at newer than the
-- purge's cutoff (an expired key is purged from the keys table before it
-- could move); a key becomes completed with updated_at = now(), newer
-- than any move's cutoff. The janitor keeps the marks for each queue
-- between its rounds and forgets them when it starts and every hour: a
-- row that did land under a mark (a key completed by a transaction older
-- than archive_after, one a claim held while the move passed it, another
-- host's move of a key that expired meanwhile) only stays where it is
-- longer, which loses no guarantee. Rows at the mark itself are read
-- again (>=), so that ties split by a batch's LIMIT are not passed by.

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

CREATE OR REPLACE FUNCTION sekali.archive_keys_after(
    p_queue text, p_after_ms bigint, p_batch integer, p_after timestamptz,
    OUT moved bigint, OUT last_updated_at timestamptz)
LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    WITH gone AS (
        DELETE FROM sekali.idempotency_keys WHERE ctid IN (
            SELECT ctid FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status = 'completed'
               AND updated_at >= coalesce(p_after, '-infinity')
               AND updated_at < now() - make_interval(secs => p_after_ms / 1000.0)
             ORDER BY updated_at
             LIMIT p_batch
             FOR UPDATE SKIP LOCKED)
        RETURNING queue, key, duplicates, completed_at, updated_at, replied_at, result),
    checkpoints AS (
        DELETE FROM sekali.checkpoints c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key),
    tombstones AS (
        DELETE FROM sekali.cancellations c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key),
    kept AS (
        INSERT INTO sekali.finished_keys AS f
               (queue, key_id, duplicates, completed_at, updated_at, replied_at, result)
        SELECT g.queue, sekali.key_id(g.key), g.duplicates,
               coalesce(g.completed_at, g.updated_at), g.updated_at, g.replied_at,
               CASE WHEN g.replied_at IS NULL THEN g.result END
          FROM gone g
        -- Only two keys with the same 128 bits meet here: they stay one.
        ON CONFLICT (queue, key_id) DO UPDATE SET
            duplicates = f.duplicates + excluded.duplicates,
            updated_at = greatest(f.updated_at, excluded.updated_at)
        RETURNING 1)
    SELECT (SELECT count(*) FROM kept), coalesce((SELECT max(updated_at) FROM gone), p_after)
      INTO moved, last_updated_at;
END
$$;

-- sql/040's functions, for a caller without a mark (an operator by hand):
-- each batch from the start, as before.
CREATE OR REPLACE FUNCTION sekali.purge_finished_keys(p_queue text, p_retention_ms bigint,
                                                      p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT deleted FROM sekali.purge_finished_keys_after(p_queue, p_retention_ms, p_batch, NULL)
$$;

CREATE OR REPLACE FUNCTION sekali.archive_keys(p_queue text, p_after_ms bigint, p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT moved FROM sekali.archive_keys_after(p_queue, p_after_ms, p_batch, NULL)
$$;
