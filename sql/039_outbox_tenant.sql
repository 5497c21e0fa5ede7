-- 039: a job enqueued through the outbox carries its tenant (issue 43).
--
-- A queue with lanes (queues[].lanes) puts each tenant's jobs in a lane of
-- its own, chosen by the tenant header. A job sekali.enqueue() wrote had
-- no tenant, so every outbox job of such a queue went to lane 0 and the
-- transactional producer, sekali's own, got no fairness. Now the relay
-- sends the tenant in the queue's tenant_header and, for a queue with
-- lanes, publishes straight to the tenant's lane: no hop through the
-- intake, whose backlog would otherwise stand between a light tenant and
-- its lane.
--
-- NULL is no tenant, what every row before this migration has; a relay of
-- an older sekali does not read the column and publishes as before.
ALTER TABLE sekali.outbox ADD COLUMN IF NOT EXISTS tenant text;

-- The tenant of a row the relay has just claimed, read beside
-- sekali.claim_outbox()'s columns and VOLATILE for the reason that
-- sekali.outbox_priority() is (sql/019).
CREATE OR REPLACE FUNCTION sekali.outbox_tenant(p_id bigint)
RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT tenant FROM sekali.outbox WHERE id = p_id
$$;

-- sekali.enqueue() gains p_tenant, last and defaulting to NULL, so every
-- existing call means what it meant; the old signature goes first (sql/019
-- says why). A tenant a header could not hold (a control character) or
-- over 255 bytes is refused here, in the producer's transaction.
-- Otherwise 032's body.
DROP FUNCTION IF EXISTS sekali.enqueue(text, text, bytea, text, text, text, timestamptz,
                                       interval, integer, text);
CREATE FUNCTION sekali.enqueue(p_queue text, p_job_type text, p_body bytea,
                                          p_idempotency_key text DEFAULT NULL,
                                          p_dedupe_key text DEFAULT NULL,
                                          p_resource_key text DEFAULT NULL,
                                          p_run_at timestamptz DEFAULT now(),
                                          p_dedupe_ttl interval DEFAULT interval '1 day',
                                          p_priority integer DEFAULT NULL,
                                          p_content_type text DEFAULT NULL,
                                          p_tenant text DEFAULT NULL)
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
    IF p_content_type = '' OR p_content_type ~ '[\x01-\x1f\x7f]' THEN
        RAISE EXCEPTION 'sekali.enqueue: the content type is %',
                        CASE WHEN p_content_type = '' THEN 'empty'
                             ELSE 'not one line of text (it holds a control character)' END
              USING ERRCODE = '22023',
                    HINT = 'A MIME type such as application/json; NULL is application/octet-stream.';
    END IF;
    IF octet_length(p_content_type) > 255 THEN
        RAISE EXCEPTION 'sekali.enqueue: the content type is % bytes long, over 255 (the AMQP limit)',
                        octet_length(p_content_type)
              USING ERRCODE = '22001';
    END IF;
    IF p_tenant = '' OR p_tenant ~ '[\x01-\x1f\x7f]' THEN
        RAISE EXCEPTION 'sekali.enqueue: the tenant is %',
                        CASE WHEN p_tenant = '' THEN 'empty'
                             ELSE 'not one line of text (it holds a control character)' END
              USING ERRCODE = '22023', HINT = 'NULL is no tenant (lane 0 of a queue with lanes).';
    END IF;
    IF octet_length(p_tenant) > 255 THEN
        RAISE EXCEPTION 'sekali.enqueue: the tenant is % bytes long, over 255',
                        octet_length(p_tenant)
              USING ERRCODE = '22001';
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
                               run_at, priority, content_type, tenant)
    VALUES (v_job_id, p_queue, p_job_type, p_body, coalesce(p_idempotency_key, v_job_id),
            p_resource_key, p_run_at, p_priority, p_content_type, p_tenant);
    PERFORM pg_notify('sekali_outbox', p_queue);
    RETURN v_job_id;
END
$$;
