-- 008: sekali.enqueue() refuses a job that could never be published or run.
--
-- A queue name or job type over 255 bytes does not fit AMQP's short string:
-- no relay can ever publish such a row, and before this check it stayed at
-- the head of the outbox. So each value is checked where the producer can
-- still be told, in its own transaction: the call fails with SQLSTATE 22001
-- (too long) or 22023 (empty), and nothing is enqueued. The limits are
-- those of the consumer too (src/envelope.c): a job type of 1 to 255 bytes,
-- keys of 1 to 512 bytes (SK_KEY_MAX). A body over 512 MiB, RabbitMQ's
-- largest possible max_message_size, is refused as well; a broker set lower
-- refuses more, and the relay records that on the row. Rows already in the
-- table are not touched: the relay refuses those it cannot publish (their
-- publish_error says why) and goes on with the rows behind them.
--
-- Same signature as 004's, so callers and grants are unchanged. Text cannot
-- hold a NUL byte, and in a UTF8 database it is valid UTF-8.
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
                               run_at)
    VALUES (v_job_id, p_queue, p_job_type, p_body, coalesce(p_idempotency_key, v_job_id),
            p_resource_key, p_run_at);
    PERFORM pg_notify('sekali_outbox', p_queue);
    RETURN v_job_id;
END
$$;
