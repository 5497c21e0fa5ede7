-- 016: batch mode's fast path: keys claimed as already completed.
--
-- A batch first runs every handler in one transaction without savepoints
-- (batch.c): it commits only if every job of it succeeded, and any failure
-- rolls the whole transaction back. Inside such a transaction a claim and
-- its completion are one fact, since nothing can commit one without the
-- other, so the row is written once, completed, instead of claimed and
-- then updated: one heap tuple, one index entry and one WAL record fewer
-- per job, and no per-key completion statement. Nobody can see the row
-- before the COMMIT that makes it true; a concurrent claim of the same key
-- waits on it (the unique index, or the row lock), then finds it completed
-- and counts a duplicate, exactly as with sekali.claim().
--
-- What it returns is what sekali.claim_many() returns, key for key: ord is
-- i for p_keys[i]; claimed_status is 'processing' for a key this call
-- claimed (the status the job has to its worker until COMMIT) and the
-- finished status for a duplicate. p_keys must not repeat a key: the
-- worker passes a key's first delivery only (a repeat is a duplicate of
-- it). A key another transaction holds past lock_timeout raises and aborts
-- the statement, as sekali.claim() does.
CREATE OR REPLACE FUNCTION sekali.claim_completing(p_queue text, p_keys text[], p_owner text,
                                                   p_job_ids text[], p_job_types text[])
RETURNS TABLE (ord integer, claimed_status text, claimed_fence bigint,
               claimed_attempts integer)
LANGUAGE plpgsql AS $$
DECLARE
    claimed_keys text[] := '{}';
    fences bigint[];
    tries integer[];
    dup_keys text[] := '{}';
    dup_statuses text[];
    dup_fences bigint[];
    dup_tries integer[];
BEGIN
    -- One statement for every key. A finished key's row is locked but not
    -- written (ON CONFLICT ... WHERE), so RETURNING lists only the claims.
    WITH claimed AS (
        INSERT INTO sekali.idempotency_keys AS k
               (queue, key, status, fence, owner, attempts, job_id, job_type, completed_at)
        SELECT p_queue, u.key, 'completed', 1, p_owner, 1, u.job_id, u.job_type, now()
          FROM unnest(p_keys, p_job_ids, p_job_types) AS u(key, job_id, job_type)
        ON CONFLICT (queue, key) DO UPDATE SET
            status = 'completed', fence = k.fence + 1, attempts = k.attempts + 1,
            owner = excluded.owner, job_id = excluded.job_id, result = NULL, error = NULL,
            completed_at = now(), updated_at = now()
        WHERE k.status = 'processing'
        RETURNING k.key, k.fence, k.attempts)
    SELECT coalesce(array_agg(c.key), '{}'), array_agg(c.fence), array_agg(c.attempts)
      INTO claimed_keys, fences, tries
      FROM claimed c;

    -- The duplicates, counted as sekali.claim() counts them: a statement of
    -- its own, so that it sees a row another transaction committed while
    -- the INSERT waited for it. Our INSERT holds their rows locked.
    IF cardinality(claimed_keys) < cardinality(p_keys) THEN
        WITH dup AS (
            UPDATE sekali.idempotency_keys
               SET duplicates = duplicates + 1, updated_at = now()
             WHERE queue = p_queue AND key = ANY (p_keys) AND NOT (key = ANY (claimed_keys))
            RETURNING key, status, fence, attempts)
        SELECT coalesce(array_agg(d.key), '{}'), array_agg(d.status), array_agg(d.fence),
               array_agg(d.attempts)
          INTO dup_keys, dup_statuses, dup_fences, dup_tries
          FROM dup d;
        IF cardinality(claimed_keys) + cardinality(dup_keys) <> cardinality(p_keys) THEN
            RAISE EXCEPTION 'sekali: claim_completing(%) lost track of a key', p_queue;
        END IF;
    END IF;

    -- From the arrays alone: no second look at the table.
    RETURN QUERY
        SELECT u.i::integer,
               CASE WHEN c.i IS NOT NULL THEN 'processing' ELSE dup_statuses[d.i] END,
               CASE WHEN c.i IS NOT NULL THEN fences[c.i] ELSE dup_fences[d.i] END,
               CASE WHEN c.i IS NOT NULL THEN tries[c.i] ELSE dup_tries[d.i] END
          FROM unnest(p_keys) WITH ORDINALITY AS u(key, i),
               LATERAL array_position(claimed_keys, u.key) AS c(i),
               LATERAL array_position(dup_keys, u.key) AS d(i);
END
$$;

-- Sets the results of jobs whose keys sekali.claim_completing() claimed,
-- in the same transaction, before its COMMIT: only jobs that return one.
-- The fence is the claim's, checked as sekali.complete() checks it.
CREATE OR REPLACE FUNCTION sekali.set_result(p_queue text, p_key text, p_fence bigint,
                                             p_result bytea)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sekali.idempotency_keys SET result = p_result
     WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'completed';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sekali: result of %/% fenced out (fence %)', p_queue, p_key, p_fence
              USING ERRCODE = 'SK001';
    END IF;
END
$$;
