-- 032: a job keeps its content type through the outbox. Until now the
-- relay published every row as application/octet-stream, so a job enqueued
-- as JSON reached its handler (and the HTTP handler's service) as bytes.
--
-- NULL is application/octet-stream, what every row before this migration
-- was published as; a relay of an older sekali does not read the column and
-- publishes as before.
ALTER TABLE sekali.outbox ADD COLUMN IF NOT EXISTS content_type text;

-- The content type of a row the relay has just claimed, read beside
-- sekali.claim_outbox()'s columns and VOLATILE for the reason that
-- sekali.outbox_priority() is (sql/019).
CREATE OR REPLACE FUNCTION sekali.outbox_content_type(p_id bigint)
RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT content_type FROM sekali.outbox WHERE id = p_id
$$;

-- sekali.enqueue() gains p_content_type, last and defaulting to NULL, so
-- every existing call means what it meant; the old signature goes first
-- (sql/019 says why). What AMQP cannot carry, or a header could not hold
-- (a control character), is refused here, in the producer's transaction,
-- rather than dead-lettered later. Otherwise 019's body.
DROP FUNCTION IF EXISTS sekali.enqueue(text, text, bytea, text, text, text, timestamptz,
                                       interval, integer);
CREATE OR REPLACE FUNCTION sekali.enqueue(p_queue text, p_job_type text, p_body bytea,
                                          p_idempotency_key text DEFAULT NULL,
                                          p_dedupe_key text DEFAULT NULL,
                                          p_resource_key text DEFAULT NULL,
                                          p_run_at timestamptz DEFAULT now(),
                                          p_dedupe_ttl interval DEFAULT interval '1 day',
                                          p_priority integer DEFAULT NULL,
                                          p_content_type text DEFAULT NULL)
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
                               run_at, priority, content_type)
    VALUES (v_job_id, p_queue, p_job_type, p_body, coalesce(p_idempotency_key, v_job_id),
            p_resource_key, p_run_at, p_priority, p_content_type);
    PERFORM pg_notify('sekali_outbox', p_queue);
    RETURN v_job_id;
END
$$;

-- A replayed dead letter is enqueued with the content type it was
-- delivered with. Otherwise 023's body.
CREATE OR REPLACE FUNCTION sekali.dlq_replay_letter(p_id bigint, p_actor text, p_os_user text,
                                                    OUT outcome text, OUT job_id text,
                                                    OUT detail text)
LANGUAGE plpgsql AS $$
DECLARE
    l sekali.dead_letters%ROWTYPE;
    r record;
BEGIN
    SELECT * INTO l FROM sekali.dead_letters WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'gone';
        SELECT format('%s before by %s at %s%s', CASE a.action WHEN 'replay' THEN 'replayed'
                      ELSE 'purged' END, a.actor, a.at,
                      CASE WHEN a.new_job_id IS NULL THEN '' ELSE ' as job ' || a.new_job_id END),
               a.new_job_id
          INTO detail, job_id
          FROM sekali.dlq_audit a WHERE a.letter_id = p_id ORDER BY a.id DESC LIMIT 1;
        detail := coalesce(detail, 'no such dead letter');
        RETURN;
    END IF;
    IF l.malformed IS NOT NULL OR l.key IS NULL THEN
        outcome := 'malformed';
        detail := coalesce(l.malformed, 'it has no key');
        RETURN;
    END IF;
    IF l.recorded_by = 'unverified' THEN
        outcome := 'unverified';
        detail := 'its x-sekali-* headers are not sekali''s record for this queue (see dlq '
                  'show): purge it, or publish the job anew';
        RETURN;
    END IF;
    SELECT * INTO r FROM sekali.dlq_replay(l.queue, l.key, l.job_id, l.job_type, l.body,
                                           l.resource_key, l.reason, l.error, p_actor,
                                                      p_os_user);
    outcome := r.outcome;
    job_id := r.job_id;
    detail := r.detail;
    IF r.outcome = 'replayed' THEN
        UPDATE sekali.dlq_audit SET letter_id = p_id
         WHERE id = currval(pg_get_serial_sequence('sekali.dlq_audit', 'id'));
        -- The job goes out as it came in: a letter's content type came off
        -- the wire (at most 255 bytes, AMQP's shortstr) and goes back on it.
        UPDATE sekali.outbox SET content_type = nullif(l.content_type, '')
         WHERE outbox.job_id = r.job_id;
    END IF;
    IF r.outcome IN ('replayed', 'already_replayed') THEN
        DELETE FROM sekali.dead_letters WHERE id = p_id;
    END IF;
END
$$;
