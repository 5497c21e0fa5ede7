-- 042: the functions that find one key's row find it by its primary key,
-- whatever the statistics say (issue 44).
--
-- A PL/pgSQL function's statements are planned once per session with the
-- parameters left open (after five calls, a generic plan) and the plan is
-- kept until the table's statistics change. Planned while the keys table
-- is small, or known to be empty (a new deployment, a VACUUM ANALYZE of a
-- table a benchmark or an operator emptied, an archive just created by
-- sql/040), a sequential scan is the cheapest way to one row, and it stays
-- the plan while the table grows, until autovacuum's ANALYZE catches up
-- (a minute or more). Measured: sekali.complete, called once a job by
-- the batch path, read the whole keys table at every call of a run that
-- started on an emptied table: 176 buffers a call, twice the PostgreSQL CPU
-- a job of a run whose plans were made on a full one (0.59 ms against
-- 0.31, in three of five rounds of the 100 M-key benchmark's empty store);
-- 300 batches of 16 by hand: 4,803 sequential scans reading 11.6 M rows.
-- The archive's probe (sekali.adopt_finished) had the same plan while an
-- upgrade's janitor filled the new table: every new key would have read it
-- whole until an ANALYZE.
--
-- Worse, with the statistics right: sekali.complete's generic plan on the
-- 100 M-key store found its row through idempotency_keys_unfinished
-- (sql/027: queue, status, for the keys in processing and failed),
-- filtering the key, because its literal `status = 'processing'` proves
-- that partial index usable and the index is small. Every completed job
-- leaves its old, processing entry in that index until a VACUUM, so each
-- completion walked the queue's keys in flight and every completion since
-- the last VACUUM.
--
-- So: the functions that find one key's row say the status they want
-- through a variable, which a generic plan sees as a parameter and cannot
-- prove a partial index's predicate from, and plan once (generic), with
-- sequential scans off; their row is reached by the primary key (or the
-- arbiter of ON CONFLICT) whatever the statistics say. The other functions
-- that create or find a key's row get the sequential scan off alone. A
-- catalog change, under a second.

CREATE OR REPLACE FUNCTION sekali.complete(p_queue text, p_key text, p_fence bigint,
                                           p_result bytea)
RETURNS void LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    processing constant text := 'processing';
BEGIN
    UPDATE sekali.idempotency_keys
       SET status = 'completed', result = p_result, error = NULL,
           completed_at = now(), updated_at = now()
     WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = processing;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sekali: completion of %/% fenced out (fence %)', p_queue, p_key, p_fence
              USING ERRCODE = 'SK001';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION sekali.set_result(p_queue text, p_key text, p_fence bigint,
                                             p_result bytea)
RETURNS void LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    completed constant text := 'completed';
BEGIN
    UPDATE sekali.idempotency_keys SET result = p_result
     WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = completed;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sekali: result of %/% fenced out (fence %)', p_queue, p_key, p_fence
              USING ERRCODE = 'SK001';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION sekali.unclaim(p_queue text, p_key text, p_fence bigint)
RETURNS void LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    processing constant text := 'processing';
BEGIN
    DELETE FROM sekali.idempotency_keys
     WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = processing
       AND attempts = 1;
    IF NOT FOUND THEN
        UPDATE sekali.idempotency_keys
           SET fence = fence - 1, attempts = attempts - 1
         WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = processing;
    END IF;
END
$$;

ALTER FUNCTION sekali.claim(text, text, text, text, text) SET enable_seqscan = off;
ALTER FUNCTION sekali.claim_many(text, text[], text, text[], text[]) SET enable_seqscan = off;
ALTER FUNCTION sekali.claim_completed(text, text, text, text, text) SET enable_seqscan = off;
ALTER FUNCTION sekali.claim_completing(text, text[], text, text[], text[])
    SET enable_seqscan = off;
ALTER FUNCTION sekali.claim_lease(text, text, text, text, text, integer) SET enable_seqscan = off;
ALTER FUNCTION sekali.unclaim_many(text, text[], bigint[]) SET enable_seqscan = off;
ALTER FUNCTION sekali.fail(text, text, text, text, text, text) SET enable_seqscan = off;
ALTER FUNCTION sekali.cancel(text, text, text, text, boolean) SET enable_seqscan = off;
ALTER FUNCTION sekali.adopt_finished(text, text) SET enable_seqscan = off;
