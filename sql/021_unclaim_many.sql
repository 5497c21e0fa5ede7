-- 021: a batch closed early gives back the keys it claimed but did not run.
--
-- A batch's handlers share its transaction, so a slow handler keeps every
-- row its batch-mates touched locked until the one COMMIT. The worker
-- therefore stops running handlers once they have run for
-- queues[].batch_close_after (batch.c): the jobs that ran commit, and the
-- keys claimed for the ones that did not are taken back here, inside the
-- same transaction, so that the COMMIT makes them true for the jobs that
-- ran only. The jobs left over are claimed again by the next transaction.
--
-- Each key is undone as its claim did it, at the fence the claim returned:
-- a row the claim created (attempts 1) is deleted; a row it took over from
-- an earlier attempt goes back to that attempt's fence and count, status
-- processing. Both claims are covered: the fast way's (written completed,
-- sql/016) and the careful way's (processing, sql/015), whose one-key undo
-- is sekali.unclaim(). Only the worker's own open transaction holds these
-- rows at these fences, so no committed outcome can match.
CREATE OR REPLACE FUNCTION sekali.unclaim_many(p_queue text, p_keys text[], p_fences bigint[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM sekali.idempotency_keys k
     USING unnest(p_keys, p_fences) AS u(key, fence)
     WHERE k.queue = p_queue AND k.key = u.key AND k.fence = u.fence
       AND k.status IN ('processing', 'completed') AND k.attempts = 1;
    UPDATE sekali.idempotency_keys k
       SET status = 'processing', fence = k.fence - 1, attempts = k.attempts - 1,
           completed_at = NULL
      FROM unnest(p_keys, p_fences) AS u(key, fence)
     WHERE k.queue = p_queue AND k.key = u.key AND k.fence = u.fence
       AND k.status IN ('processing', 'completed');
END
$$;
