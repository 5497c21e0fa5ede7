-- 017: one job per transaction claims its key as completed, in one statement.
--
-- A job alone in its transaction (batch: 1, transactional mode) commits its
-- claim only together with its handler's effect: a failed handler rolls the
-- whole transaction back, the claim with it. So, as in a batch's fast path
-- (016), the claim and its completion are one fact and the row can be
-- written once, completed, instead of claimed by sekali.claim() and then
-- updated by sekali.complete(). Measured against the hand-written loop's
-- three statements (docs/benchmark.md), the completion was where most of
-- PostgreSQL's extra time per job went: a second plpgsql call, a second
-- heap tuple and its WAL record, and an UPDATE whose generic plan, made
-- while the table was small (a new install, or just after a VACUUM emptied
-- it), is a sequential scan that the session keeps for as long as it runs.
-- The INSERT below always goes through the primary key (it is the arbiter
-- of its ON CONFLICT), whatever the table's statistics.
--
-- Returns what sekali.claim() returns: 'processing' with the new fence and
-- attempt count for a key this call claimed (the status the job has to its
-- worker until COMMIT), or the finished status of a duplicate, counted. A
-- concurrent claim of the same key waits on the first, then finds it
-- completed and counts a duplicate, as with sekali.claim().
CREATE OR REPLACE FUNCTION sekali.claim_completed(p_queue text, p_key text, p_owner text,
                                                  p_job_id text, p_job_type text,
                                                  OUT claimed_status text,
                                                  OUT claimed_fence bigint,
                                                  OUT claimed_attempts integer)
LANGUAGE plpgsql AS $$
BEGIN
    -- plpgsql rather than sql: it keeps both statements' plans across calls.
    -- A finished key's row is locked but not written (ON CONFLICT ... WHERE).
    INSERT INTO sekali.idempotency_keys AS k
           (queue, key, status, fence, owner, attempts, job_id, job_type, completed_at)
    VALUES (p_queue, p_key, 'completed', 1, p_owner, 1, p_job_id, p_job_type, now())
    ON CONFLICT (queue, key) DO UPDATE SET
        status = 'completed', fence = k.fence + 1, attempts = k.attempts + 1,
        owner = excluded.owner, job_id = excluded.job_id, result = NULL, error = NULL,
        completed_at = now(), updated_at = now()
    WHERE k.status = 'processing'
    RETURNING 'processing', k.fence, k.attempts
         INTO claimed_status, claimed_fence, claimed_attempts;
    IF FOUND THEN
        RETURN;
    END IF;
    -- A duplicate: its own statement, so that it sees a row another
    -- transaction committed while the INSERT waited for it. The INSERT holds
    -- the row locked; the rare path, so its plan does not matter.
    UPDATE sekali.idempotency_keys SET duplicates = duplicates + 1, updated_at = now()
     WHERE queue = p_queue AND key = p_key
    RETURNING status, fence, attempts INTO claimed_status, claimed_fence, claimed_attempts;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sekali: claim_completed(%/%) lost track of its key', p_queue, p_key;
    END IF;
END
$$;
