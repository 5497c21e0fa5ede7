-- 011: what sekalictl status reads of one queue in PostgreSQL, in one call.
--
-- Keys in hand (processing) and given up (failed), the age of the oldest key
-- still processing (a job stuck, or a worker that died holding it), and the
-- outbox rows bound for the queue that no relay has published yet: how many,
-- how many a relay refused (publish_error), and how long the oldest due one
-- has waited. Read-only and STABLE: it takes no lock a worker would wait on.
CREATE OR REPLACE FUNCTION sekali.queue_status(p_queue text,
                                               OUT processing bigint, OUT failed bigint,
                                               OUT oldest_processing_s double precision,
                                               OUT outbox_pending bigint,
                                               OUT outbox_refused bigint,
                                               OUT outbox_lag_s double precision)
LANGUAGE sql STABLE AS $$
    SELECT k.processing, k.failed, k.oldest, o.pending, o.refused, o.lag
    FROM (SELECT count(*) FILTER (WHERE status = 'processing') AS processing,
                 count(*) FILTER (WHERE status = 'failed') AS failed,
                 extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'processing'))::float8
                     AS oldest
          FROM sekali.idempotency_keys WHERE queue = p_queue) k,
         (SELECT count(*) FILTER (WHERE publish_error IS NULL AND run_at <= now()) AS pending,
                 count(*) FILTER (WHERE publish_error IS NOT NULL) AS refused,
                 coalesce(extract(epoch FROM now() - min(run_at)
                          FILTER (WHERE publish_error IS NULL AND run_at <= now()))::float8, 0)
                     AS lag
          FROM sekali.outbox WHERE published_at IS NULL AND queue = p_queue) o
$$;

-- What PostgreSQL knows of one idempotency key, as dated events for
-- sekalictl trace: its outbox rows, its idempotency row, its crash count
-- and the dead-letter actions taken on it; in every queue, or in p_queue.
-- seq orders events of the same instant as they happen in a job's life.
-- The outbox has no index on idempotency_key (the producers' hot path
-- should not pay for one): a trace reads the whole table, which the janitor
-- keeps short.
CREATE OR REPLACE FUNCTION sekali.trace(p_key text, p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, at timestamptz, seq integer, source text, event text, detail text)
LANGUAGE sql STABLE AS $$
    SELECT o.queue, o.created_at, 1, 'outbox', 'enqueued',
           format('job %s, type %s, %s bytes, due %s%s', o.job_id, o.job_type,
                  octet_length(o.body), o.run_at,
                  CASE WHEN o.resource_key IS NULL THEN ''
                       ELSE ', resource ' || o.resource_key END)
      FROM sekali.outbox o
     WHERE o.idempotency_key = p_key AND (p_queue IS NULL OR o.queue = p_queue)
    UNION ALL
    SELECT o.queue, o.published_at, 2, 'outbox', 'published',
           format('job %s published to the broker by a relay', o.job_id)
      FROM sekali.outbox o
     WHERE o.idempotency_key = p_key AND (p_queue IS NULL OR o.queue = p_queue)
       AND o.published_at IS NOT NULL
    UNION ALL
    -- A refused row keeps no time of its own: shown at its due time.
    SELECT o.queue, o.run_at, 3, 'outbox', 'publish refused',
           format('job %s: %s', o.job_id, o.publish_error)
      FROM sekali.outbox o
     WHERE o.idempotency_key = p_key AND (p_queue IS NULL OR o.queue = p_queue)
       AND o.publish_error IS NOT NULL
    UNION ALL
    SELECT k.queue, k.created_at, 4, 'key', 'claimed',
           format('first claim: job %s, type %s', k.job_id, k.job_type)
      FROM sekali.idempotency_keys k
     WHERE k.key = p_key AND (p_queue IS NULL OR k.queue = p_queue)
    UNION ALL
    SELECT k.queue, coalesce(k.completed_at, k.updated_at), 5, 'key', k.status,
           format('%s after %s attempt(s) and %s claim(s) (fence %s), owner %s, job %s%s%s',
                  k.status, k.attempts, k.fence, k.fence, coalesce(k.owner, '-'), k.job_id,
                  CASE WHEN k.error IS NULL THEN '' ELSE ', error: ' || k.error END,
                  CASE WHEN k.result IS NULL THEN ''
                       ELSE format(', result %s bytes', octet_length(k.result)) END)
      FROM sekali.idempotency_keys k
     WHERE k.key = p_key AND (p_queue IS NULL OR k.queue = p_queue)
    UNION ALL
    SELECT k.queue, k.replied_at, 6, 'key', 'reply sent', 'the reply was published'
      FROM sekali.idempotency_keys k
     WHERE k.key = p_key AND (p_queue IS NULL OR k.queue = p_queue) AND k.replied_at IS NOT NULL
    UNION ALL
    SELECT k.queue, k.updated_at, 7, 'key', 'duplicates',
           format('%s duplicate deliver%s acked without running the handler, the last now',
                  k.duplicates, CASE WHEN k.duplicates = 1 THEN 'y' ELSE 'ies' END)
      FROM sekali.idempotency_keys k
     WHERE k.key = p_key AND (p_queue IS NULL OR k.queue = p_queue) AND k.duplicates > 0
    UNION ALL
    SELECT c.queue, c.last_crash, 8, 'crashes', 'crashed',
           format('its worker died running it %s time(s), the last now', c.crashes)
      FROM sekali.job_crashes c
     WHERE c.key = p_key AND (p_queue IS NULL OR c.queue = p_queue)
    UNION ALL
    SELECT a.queue, a.at, 9, 'dlq_audit', 'dead letter ' || a.action,
           format('by %s (OS user %s): reason %s, key was %s after %s attempt(s), %s crash(es)%s',
                  a.actor, a.os_user, coalesce(a.reason, '-'), coalesce(a.old_status, '-'),
                  coalesce(a.old_attempts::text, '-'), coalesce(a.old_crashes::text, '-'),
                  CASE WHEN a.new_job_id IS NULL THEN '' ELSE ', new job ' || a.new_job_id END)
      FROM sekali.dlq_audit a
     WHERE a.key = p_key AND (p_queue IS NULL OR a.queue = p_queue)
$$;
