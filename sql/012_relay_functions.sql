-- 012: the outbox relay's and the janitor's statements, as functions of
-- schema sekali like claim/complete/fail: the daemon keeps no SQL of its own
-- against these tables, and an operator at psql can run exactly what a relay
-- or the janitor runs.

-- A relay's batch: up to p_batch due rows, locked for the calling
-- transaction alone (SKIP LOCKED: relays share the table without waiting on
-- each other). Refused rows (publish_error) stay out until cleared.
CREATE OR REPLACE FUNCTION sekali.claim_outbox(p_batch integer)
RETURNS TABLE (id bigint, job_id text, queue text, job_type text, body bytea,
               idempotency_key text, resource_key text)
LANGUAGE sql AS $$
    SELECT o.id, o.job_id, o.queue, o.job_type, o.body, o.idempotency_key, o.resource_key
      FROM sekali.outbox o
     WHERE o.published_at IS NULL AND o.publish_error IS NULL AND o.run_at <= now()
     ORDER BY o.run_at, o.id
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED
$$;

-- The rows the broker confirmed, marked published; returns how many.
CREATE OR REPLACE FUNCTION sekali.mark_outbox(p_published bigint[])
RETURNS bigint LANGUAGE sql AS $$
    WITH marked AS (
        UPDATE sekali.outbox SET published_at = now()
         WHERE id = ANY(p_published) RETURNING 1)
    SELECT count(*) FROM marked
$$;

-- A row the broker refused (no such queue, too large, not carriable by
-- AMQP): kept unpublished with the reason, and skipped until cleared.
CREATE OR REPLACE FUNCTION sekali.refuse_outbox(p_id bigint, p_error text)
RETURNS void LANGUAGE sql AS $$
    UPDATE sekali.outbox SET publish_error = p_error WHERE id = p_id
$$;

-- The backlog per target queue, for the relays' gauges: due rows and the
-- lag of the oldest, and refused rows. Each half reads one partial index
-- (sql/005).
CREATE OR REPLACE FUNCTION sekali.outbox_backlog()
RETURNS TABLE (queue text, pending bigint, failed bigint, lag_ms bigint)
LANGUAGE sql STABLE AS $$
    SELECT b.queue, sum(b.pending)::bigint, sum(b.failed)::bigint, max(b.lag_ms)::bigint FROM (
        SELECT o.queue, count(*) AS pending, 0 AS failed,
               (extract(epoch FROM now() - min(o.run_at)) * 1000)::bigint AS lag_ms
          FROM sekali.outbox o
         WHERE o.published_at IS NULL AND o.publish_error IS NULL AND o.run_at <= now()
         GROUP BY o.queue
        UNION ALL
        SELECT o.queue, 0, count(*), 0
          FROM sekali.outbox o
         WHERE o.published_at IS NULL AND o.publish_error IS NOT NULL
         GROUP BY o.queue
    ) AS b GROUP BY b.queue
$$;

-- Retention, one batch per call (so no call holds many row locks or a long
-- transaction); each returns the rows it deleted, and the janitor calls
-- again until a batch comes back short.

-- Keys of p_queue finished (completed or failed) more than p_retention_ms
-- ago, with their checkpoints. A key still processing is never touched.
CREATE OR REPLACE FUNCTION sekali.purge_keys(p_queue text, p_retention_ms bigint,
                                             p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM sekali.idempotency_keys WHERE ctid IN (
            SELECT ctid FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status IN ('completed', 'failed')
               AND updated_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             LIMIT p_batch)
        RETURNING queue, key),
    checkpoints AS (
        DELETE FROM sekali.checkpoints c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key)
    SELECT count(*) FROM gone
$$;

-- Outbox rows published more than p_retention_ms ago; unpublished rows stay.
CREATE OR REPLACE FUNCTION sekali.purge_outbox(p_retention_ms bigint, p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM sekali.outbox WHERE ctid IN (
            SELECT ctid FROM sekali.outbox
             WHERE published_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Dedupe keys released or expired more than an hour ago: for that hour a
-- released key still tells who held it, when asked.
CREATE OR REPLACE FUNCTION sekali.purge_dedupe(p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM sekali.job_dedupe WHERE ctid IN (
            SELECT ctid FROM sekali.job_dedupe
             WHERE released_at < now() - interval '1 hour'
                OR expires_at < now() - interval '1 hour'
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Crash counts (sql/006) a day old: a crash loop crashes within minutes,
-- so a day-old count is history.
CREATE OR REPLACE FUNCTION sekali.purge_crashes(p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM sekali.job_crashes WHERE ctid IN (
            SELECT ctid FROM sekali.job_crashes
             WHERE last_crash < now() - interval '1 day'
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;
