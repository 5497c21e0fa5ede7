-- 019: pause and resume a queue, and job priorities.
--
-- A pause is a row here, so that it holds for every host's workers and
-- outlives any restart: a worker reads it before it subscribes and is told
-- of a change by NOTIFY sekali_pause (payload: the queue), with a poll as
-- the fallback for a NOTIFY lost with a connection. While a queue is
-- paused its workers finish the job in hand and cancel their consumers;
-- the messages stay in RabbitMQ. The outbox relay does not look here: a
-- paused queue still receives its jobs.
CREATE TABLE IF NOT EXISTS sekali.queue_pauses (
    queue     text        PRIMARY KEY,
    reason    text,
    paused_by text,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- Pauses p_queue; true if this call paused it, false if it already was (the
-- first pause's reason and time are kept: they say when the incident began).
CREATE OR REPLACE FUNCTION sekali.pause(p_queue text, p_reason text DEFAULT NULL,
                                        p_by text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_new boolean;
BEGIN
    IF p_queue IS NULL OR p_queue = '' OR octet_length(p_queue) > 255 THEN
        RAISE EXCEPTION 'sekali.pause: the queue name is empty or over 255 bytes'
              USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_reason) > 1000 OR octet_length(p_by) > 255 THEN
        RAISE EXCEPTION 'sekali.pause: the reason (at most 1000 bytes) or the name (255) is too long'
              USING ERRCODE = '22001';
    END IF;
    INSERT INTO sekali.queue_pauses (queue, reason, paused_by)
    VALUES (p_queue, p_reason, p_by)
    ON CONFLICT (queue) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    PERFORM pg_notify('sekali_pause', p_queue);
    RETURN v_new;
END
$$;

-- Resumes p_queue; true if it was paused.
CREATE OR REPLACE FUNCTION sekali.resume(p_queue text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_was boolean;
BEGIN
    DELETE FROM sekali.queue_pauses WHERE queue = p_queue;
    GET DIAGNOSTICS v_was = ROW_COUNT;
    PERFORM pg_notify('sekali_pause', p_queue);
    RETURN v_was;
END
$$;

-- What a worker asks before it subscribes and when told of a change.
CREATE OR REPLACE FUNCTION sekali.is_paused(p_queue text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM sekali.queue_pauses WHERE queue = p_queue)
$$;

-- A job's AMQP priority (0-255), published by the relay; NULL: none.
ALTER TABLE sekali.outbox ADD COLUMN IF NOT EXISTS priority smallint;

-- The priority of an outbox row the relay has just claimed, read beside
-- sekali.claim_outbox()'s columns (which stay as they are). VOLATILE on
-- purpose: claim_outbox() runs its query with a snapshot of its own, so it
-- can return a row committed after the calling statement's snapshot was
-- taken; a plain subquery there would not see that row and read NULL. A
-- volatile function takes a fresh snapshot, which sees every row claimed.
CREATE OR REPLACE FUNCTION sekali.outbox_priority(p_id bigint)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT priority::integer FROM sekali.outbox WHERE id = p_id
$$;

-- sekali.enqueue() gains p_priority, last and defaulting to NULL, so that
-- every existing call (positional or named) means what it meant. A new
-- parameter makes a new signature: the old one is dropped first, or the two
-- would make every call of the old shape ambiguous. Otherwise 008's body.
DROP FUNCTION IF EXISTS sekali.enqueue(text, text, bytea, text, text, text, timestamptz,
                                       interval);
CREATE FUNCTION sekali.enqueue(p_queue text, p_job_type text, p_body bytea,
                               p_idempotency_key text DEFAULT NULL,
                               p_dedupe_key text DEFAULT NULL,
                               p_resource_key text DEFAULT NULL,
                               p_run_at timestamptz DEFAULT now(),
                               p_dedupe_ttl interval DEFAULT interval '1 day',
                               p_priority integer DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_job_id text := gen_random_uuid()::text;
    v_held   text;
BEGIN
    IF p_queue IS NULL OR p_queue = '' THEN
        RAISE EXCEPTION 'sekali.enqueue: the queue name is empty'
              USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_queue) > 255 THEN
        RAISE EXCEPTION 'sekali.enqueue: the queue name is % bytes long, over 255 (the AMQP limit)',
                        octet_length(p_queue)
              USING ERRCODE = '22001', HINT = 'RabbitMQ queue names are at most 255 bytes.';
    END IF;
    IF p_job_type IS NULL OR p_job_type = '' THEN
        RAISE EXCEPTION 'sekali.enqueue: the job type is empty'
              USING ERRCODE = '22023', HINT = 'Workers dead-letter a job with an empty type.';
    END IF;
    IF octet_length(p_job_type) > 255 THEN
        RAISE EXCEPTION 'sekali.enqueue: the job type is % bytes long, over 255 (the AMQP limit)',
                        octet_length(p_job_type)
              USING ERRCODE = '22001';
    END IF;
    IF p_idempotency_key = '' OR p_resource_key = '' THEN
        RAISE EXCEPTION 'sekali.enqueue: the % key is empty',
                        CASE WHEN p_idempotency_key = '' THEN 'idempotency' ELSE 'resource' END
              USING ERRCODE = '22023', HINT = 'Pass NULL for the default key.';
    END IF;
    IF octet_length(p_idempotency_key) > 512 OR octet_length(p_resource_key) > 512 THEN
        RAISE EXCEPTION 'sekali.enqueue: the % key is % bytes long, over 512 (sekali''s limit)',
                        CASE WHEN octet_length(p_idempotency_key) > 512
                             THEN 'idempotency' ELSE 'resource' END,
                        greatest(octet_length(p_idempotency_key), octet_length(p_resource_key))
              USING ERRCODE = '22001';
    END IF;
    IF p_body IS NULL THEN
        RAISE EXCEPTION 'sekali.enqueue: the body is NULL'
              USING ERRCODE = '22004', HINT = 'An empty body is ''''::bytea.';
    END IF;
    IF p_priority < 0 OR p_priority > 255 THEN
        RAISE EXCEPTION 'sekali.enqueue: the priority % is outside 0..255 (an AMQP octet)',
                        p_priority
              USING ERRCODE = '22003',
                    HINT = 'A queue honours priorities up to its max_priority; NULL is none.';
    END IF;
    IF octet_length(p_body) > 536870912 THEN
        RAISE EXCEPTION 'sekali.enqueue: the body is % bytes long, over 512 MiB '
                        '(RabbitMQ''s limit)', octet_length(p_body)
              USING ERRCODE = '22001';
    END IF;

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
                               run_at, priority)
    VALUES (v_job_id, p_queue, p_job_type, p_body, coalesce(p_idempotency_key, v_job_id),
            p_resource_key, p_run_at, p_priority);
    PERFORM pg_notify('sekali_outbox', p_queue);
    RETURN v_job_id;
END
$$;
