-- 004: the producer side. sekali.enqueue() is called inside the producer's
-- own business transaction: the job exists if and only if that transaction
-- commits. An outbox relay (sekalid's relay processes) publishes committed
-- rows with publisher confirms and marks them only after the confirm, so a
-- crash in between publishes twice at worst, which the consumer side absorbs.

CREATE TABLE IF NOT EXISTS sekali.outbox (
    id              bigserial   PRIMARY KEY,
    job_id          text        NOT NULL UNIQUE,
    queue           text        NOT NULL,
    job_type        text        NOT NULL,
    body            bytea       NOT NULL,
    idempotency_key text        NOT NULL,
    resource_key    text,
    run_at          timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    publish_error   text        -- e.g. unroutable: no such queue; the row stays unpublished
);
-- The relay's work list: unpublished rows by due time.
CREATE INDEX IF NOT EXISTS outbox_due ON sekali.outbox (run_at, id) WHERE published_at IS NULL;

-- One row per live dedupe key: unique until its job finishes (the worker
-- releases it in the job's own transaction) or until expires_at.
CREATE TABLE IF NOT EXISTS sekali.job_dedupe (
    dedupe_key  text        PRIMARY KEY,
    queue       text        NOT NULL,
    job_id      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    released_at timestamptz
);

-- Enqueues a job in the caller's transaction and returns its job id: for a
-- dedupe key that is still held, the id of the job holding it (nothing new
-- is enqueued). The relay is woken by NOTIFY, delivered at COMMIT.
CREATE OR REPLACE FUNCTION sekali.enqueue(p_queue text, p_job_type text, p_body bytea,
                                          p_idempotency_key text DEFAULT NULL,
                                          p_dedupe_key text DEFAULT NULL,
                                          p_resource_key text DEFAULT NULL,
                                          p_run_at timestamptz DEFAULT now(),
                                          p_dedupe_ttl interval DEFAULT interval '1 day')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_job_id text := gen_random_uuid()::text;
    v_held   text;
BEGIN
    IF p_dedupe_key IS NOT NULL THEN
        -- A key whose job finished or whose TTL ran out is taken over; a
        -- live one wins. Concurrent callers serialise on the key's row.
        INSERT INTO sekali.job_dedupe AS d (dedupe_key, queue, job_id, expires_at)
        VALUES (p_dedupe_key, p_queue, v_job_id, now() + p_dedupe_ttl)
        ON CONFLICT (dedupe_key) DO UPDATE
           SET queue = excluded.queue, job_id = excluded.job_id,
               expires_at = excluded.expires_at, released_at = NULL
         WHERE d.released_at IS NOT NULL OR d.expires_at <= now()
        RETURNING job_id INTO v_held;
        IF v_held IS NULL THEN
            SELECT job_id INTO v_held FROM sekali.job_dedupe WHERE dedupe_key = p_dedupe_key;
            RETURN v_held;
        END IF;
    END IF;
    INSERT INTO sekali.outbox (job_id, queue, job_type, body, idempotency_key, resource_key,
                               run_at)
    VALUES (v_job_id, p_queue, p_job_type, p_body, coalesce(p_idempotency_key, v_job_id),
            p_resource_key, p_run_at);
    PERFORM pg_notify('sekali_outbox', p_queue);
    RETURN v_job_id;
END
$$;

-- A finished job (completed or failed, in the worker's transaction) frees
-- its dedupe key in that same transaction, so a key never outlives its job.
CREATE INDEX IF NOT EXISTS job_dedupe_by_job ON sekali.job_dedupe (job_id);

CREATE OR REPLACE FUNCTION sekali.release_dedupe() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sekali.job_dedupe SET released_at = now()
     WHERE job_id = NEW.job_id AND released_at IS NULL;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS release_dedupe ON sekali.idempotency_keys;
CREATE TRIGGER release_dedupe
    AFTER INSERT OR UPDATE OF status ON sekali.idempotency_keys
    FOR EACH ROW WHEN (NEW.status IN ('completed', 'failed'))
    EXECUTE FUNCTION sekali.release_dedupe();
