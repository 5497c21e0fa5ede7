-- 028: the reads that counted every retained key, rewritten to use the
-- indexes of sql/027 (issue 44). Same results, same signatures.
--
-- Each runs with jit off. Their plans are generic (a SQL function plans
-- with parameters), and at millions of keys the estimates of a generic
-- plan pass jit_above_cost: PostgreSQL then compiled each janitor batch
-- (100 ms of a 130 ms batch at 10 M keys) for a statement that reads a
-- thousand index entries.

-- Retention (replaces 018's): the expired keys in the order of
-- idempotency_keys_expiry, so that a batch reads the rows it deletes and
-- a round with nothing expired reads one index page, however many keys
-- are retained. Cancelled keys go like finished ones, with their
-- tombstones.
CREATE OR REPLACE FUNCTION sekali.purge_keys(p_queue text, p_retention_ms bigint,
                                             p_batch integer)
RETURNS bigint LANGUAGE sql SET jit = off AS $$
    WITH gone AS (
        DELETE FROM sekali.idempotency_keys WHERE ctid IN (
            SELECT ctid FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status IN ('completed', 'failed', 'cancelled')
               AND updated_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             ORDER BY updated_at
             LIMIT p_batch)
        RETURNING queue, key),
    checkpoints AS (
        DELETE FROM sekali.checkpoints c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key),
    tombstones AS (
        DELETE FROM sekali.cancellations c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key)
    SELECT count(*) FROM gone
$$;

-- sekalictl status (replaces 011's): each count reads the entries of
-- idempotency_keys_unfinished for its status, not the queue's keys.
CREATE OR REPLACE FUNCTION sekali.queue_status(p_queue text,
                                               OUT processing bigint, OUT failed bigint,
                                               OUT oldest_processing_s double precision,
                                               OUT outbox_pending bigint,
                                               OUT outbox_refused bigint,
                                               OUT outbox_lag_s double precision)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT (SELECT count(*) FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status = 'processing'),
           (SELECT count(*) FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status = 'failed'),
           (SELECT extract(epoch FROM now() - min(created_at))::float8
              FROM sekali.idempotency_keys WHERE queue = p_queue AND status = 'processing'),
           o.pending, o.refused, o.lag
    FROM (SELECT count(*) FILTER (WHERE publish_error IS NULL AND run_at <= now()) AS pending,
                 count(*) FILTER (WHERE publish_error IS NOT NULL) AS refused,
                 coalesce(extract(epoch FROM now() - min(run_at)
                          FILTER (WHERE publish_error IS NULL AND run_at <= now()))::float8, 0)
                     AS lag
          FROM sekali.outbox WHERE published_at IS NULL AND queue = p_queue) o
$$;

-- sekalictl trace (replaces 011's): the key's row found through the
-- primary key in each queue. The outbox still has no index on
-- idempotency_key (the producers' hot path would pay for it): its part
-- reads the outbox, which outbox_retention keeps to a week by default.
CREATE OR REPLACE FUNCTION sekali.trace(p_key text, p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, at timestamptz, seq integer, source text, event text, detail text)
LANGUAGE sql STABLE SET jit = off AS $$
    -- The key in every queue: the queues are found by skipping through the
    -- primary key (one probe per queue), then the key is one probe in each.
    -- A lookup by key alone could not use the primary key (queue comes
    -- first) and read every retained key.
    WITH RECURSIVE queues(queue) AS (
        SELECT coalesce(p_queue, (SELECT min(i.queue) FROM sekali.idempotency_keys i))
        UNION ALL
        SELECT (SELECT min(i.queue) FROM sekali.idempotency_keys i WHERE i.queue > q.queue)
          FROM queues q WHERE p_queue IS NULL AND q.queue IS NOT NULL),
    keys AS MATERIALIZED (
        SELECT k.* FROM queues q JOIN sekali.idempotency_keys k
            ON k.queue = q.queue AND k.key = p_key)
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
      FROM keys k
    UNION ALL
    SELECT k.queue, coalesce(k.completed_at, k.updated_at), 5, 'key', k.status,
           format('%s after %s attempt(s) and %s claim(s) (fence %s), owner %s, job %s%s%s',
                  k.status, k.attempts, k.fence, k.fence, coalesce(k.owner, '-'), k.job_id,
                  CASE WHEN k.error IS NULL THEN '' ELSE ', error: ' || k.error END,
                  CASE WHEN k.result IS NULL THEN ''
                       ELSE format(', result %s bytes', octet_length(k.result)) END)
      FROM keys k
    UNION ALL
    SELECT k.queue, k.replied_at, 6, 'key', 'reply sent', 'the reply was published'
      FROM keys k
     WHERE k.replied_at IS NOT NULL
    UNION ALL
    SELECT k.queue, k.updated_at, 7, 'key', 'duplicates',
           format('%s duplicate deliver%s acked without running the handler, the last now',
                  k.duplicates, CASE WHEN k.duplicates = 1 THEN 'y' ELSE 'ies' END)
      FROM keys k
     WHERE k.duplicates > 0
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
