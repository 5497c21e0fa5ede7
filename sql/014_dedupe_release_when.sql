-- 014: the dedupe-release trigger (004) fires only for jobs that can hold a
-- dedupe key.
--
-- Every completion or failure ran sekali.release_dedupe(): a plpgsql call
-- and an UPDATE of sekali.job_dedupe, also for queues that never use the
-- outbox. Dedupe rows are written only by sekali.enqueue(), whose job ids
-- are gen_random_uuid() text: 36 characters with the version digit '4' at
-- position 15. The trigger's WHEN now tests that shape, which PostgreSQL
-- evaluates in the executor without calling the function: a job published
-- straight to RabbitMQ with any other message id costs nothing here. A
-- producer whose own message ids are version-4 UUIDs still pays the call,
-- as every job did before, and gets the same result (no row to release).
DROP TRIGGER IF EXISTS release_dedupe ON sekali.idempotency_keys;
CREATE TRIGGER release_dedupe
    AFTER INSERT OR UPDATE OF status ON sekali.idempotency_keys
    FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed') AND length(NEW.job_id) = 36
          AND substr(NEW.job_id, 15, 1) = '4')
    EXECUTE FUNCTION sekali.release_dedupe();
