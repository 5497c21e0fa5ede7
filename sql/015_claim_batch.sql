-- 015: batch mode (queues[].batch > 1): many keys claimed in one statement,
-- and a claim undone when only its job's savepoint is rolled back.

-- Claims p_keys[i] for the calling transaction, in order, exactly as
-- sekali.claim() would one by one (the same row locks, the same duplicate
-- counts): one row per key, ord being i. A key another transaction holds
-- past lock_timeout raises as sekali.claim() does and aborts the statement;
-- the worker then falls back to claiming its jobs one at a time.
CREATE OR REPLACE FUNCTION sekali.claim_many(p_queue text, p_keys text[], p_owner text,
                                             p_job_ids text[], p_job_types text[])
RETURNS TABLE (ord integer, claimed_status text, claimed_fence bigint,
               claimed_attempts integer)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        ord := i;
        SELECT c.claimed_status, c.claimed_fence, c.claimed_attempts
          INTO claimed_status, claimed_fence, claimed_attempts
          FROM sekali.claim(p_queue, p_keys[i], p_owner, p_job_ids[i], p_job_types[i]) c;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Undoes a claim that committed with the batch although its job did not:
-- its handler's savepoint was rolled back (RETRY, FAIL, an error), but the
-- claim was made before that savepoint. The row is still locked by the
-- caller, so nobody saw the fence it took: a key claimed for the first time
-- goes away, an older one gets its fence and attempt count back.
CREATE OR REPLACE FUNCTION sekali.unclaim(p_queue text, p_key text, p_fence bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM sekali.idempotency_keys
     WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'processing'
       AND attempts = 1;
    IF NOT FOUND THEN
        UPDATE sekali.idempotency_keys
           SET fence = fence - 1, attempts = attempts - 1
         WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'processing';
    END IF;
END
$$;
