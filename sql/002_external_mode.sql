-- 002: external mode. The handler acts outside PostgreSQL (a payment API),
-- so no transaction can hold the key for it. Instead the claim commits
-- `processing` with a lease that PostgreSQL's clock measures, and a fencing
-- token; the completion only counts if it still carries the newest fence. A
-- worker that stalled past its lease (a pause, a partition) can therefore
-- never overwrite the outcome of the worker that took over.

ALTER TABLE sekali.idempotency_keys
    ADD COLUMN IF NOT EXISTS fenced_out bigint NOT NULL DEFAULT 0;  -- stale completions refused

-- Recovery points: what an attempt finished, so that a takeover can skip it.
CREATE TABLE IF NOT EXISTS sekali.checkpoints (
    queue      text        NOT NULL,
    key        text        NOT NULL,
    name       text        NOT NULL,
    value      text        NOT NULL,
    fence      bigint      NOT NULL,     -- the owner that wrote it
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key, name)
);

-- Claims a key under a lease, in its own transaction. Returns
--   processing  the caller owns the key until lease_until, under the fence;
--   busy        another owner's lease is still running (lease_left_ms);
--   completed / failed  a duplicate (counted).
-- A processing row whose lease ran out is taken over with the next fence.
CREATE OR REPLACE FUNCTION sekali.claim_lease(p_queue text, p_key text, p_owner text,
                                              p_job_id text, p_job_type text, p_lease_ms integer,
                                              OUT claimed_status text, OUT claimed_fence bigint,
                                              OUT claimed_attempts integer,
                                              OUT lease_left_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    k sekali.idempotency_keys%ROWTYPE;
BEGIN
    INSERT INTO sekali.idempotency_keys
           (queue, key, status, fence, owner, attempts, job_id, job_type, lease_until)
    VALUES (p_queue, p_key, 'processing', 1, p_owner, 1, p_job_id, p_job_type,
            now() + make_interval(secs => p_lease_ms / 1000.0))
    ON CONFLICT (queue, key) DO NOTHING;
    IF FOUND THEN
        claimed_status := 'processing'; claimed_fence := 1; claimed_attempts := 1;
        lease_left_ms := p_lease_ms;
        RETURN;
    END IF;

    SELECT * INTO k FROM sekali.idempotency_keys
     WHERE queue = p_queue AND key = p_key FOR UPDATE;
    IF k.status <> 'processing' THEN
        UPDATE sekali.idempotency_keys SET duplicates = duplicates + 1, updated_at = now()
         WHERE queue = p_queue AND key = p_key;
        claimed_status := k.status; claimed_fence := k.fence; claimed_attempts := k.attempts;
        RETURN;
    END IF;
    IF k.lease_until > now() THEN
        claimed_status := 'busy'; claimed_fence := k.fence; claimed_attempts := k.attempts;
        lease_left_ms := ceil(extract(epoch FROM k.lease_until - now()) * 1000);
        RETURN;
    END IF;
    UPDATE sekali.idempotency_keys
       SET fence = k.fence + 1, attempts = k.attempts + 1, owner = p_owner, job_id = p_job_id,
           lease_until = now() + make_interval(secs => p_lease_ms / 1000.0), updated_at = now()
     WHERE queue = p_queue AND key = p_key;
    claimed_status := 'processing'; claimed_fence := k.fence + 1;
    claimed_attempts := k.attempts + 1; lease_left_ms := p_lease_ms;
END
$$;

-- Extends the lease if the caller still holds the fence.
CREATE OR REPLACE FUNCTION sekali.renew_lease(p_queue text, p_key text, p_fence bigint,
                                              p_lease_ms integer)
RETURNS boolean LANGUAGE sql AS $$
    WITH renewed AS (
        UPDATE sekali.idempotency_keys
           SET lease_until = now() + make_interval(secs => p_lease_ms / 1000.0)
         WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'processing'
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM renewed)
$$;

-- Completes (or fails) the key if the caller still holds the fence; else
-- counts a fenced-out completion and changes nothing else.
CREATE OR REPLACE FUNCTION sekali.finish_lease(p_queue text, p_key text, p_fence bigint,
                                               p_status text, p_result bytea, p_error text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sekali.idempotency_keys
       SET status = p_status, result = p_result, error = p_error, lease_until = NULL,
           completed_at = CASE WHEN p_status = 'completed' THEN now() END, updated_at = now()
     WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'processing';
    IF FOUND THEN
        RETURN true;
    END IF;
    UPDATE sekali.idempotency_keys SET fenced_out = fenced_out + 1
     WHERE queue = p_queue AND key = p_key;
    RETURN false;
END
$$;

-- Ends the caller's lease now, so that its retry copy can take over at once.
CREATE OR REPLACE FUNCTION sekali.release_lease(p_queue text, p_key text, p_fence bigint)
RETURNS boolean LANGUAGE sql AS $$
    WITH released AS (
        UPDATE sekali.idempotency_keys SET lease_until = now(), updated_at = now()
         WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'processing'
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM released)
$$;

-- Saves a recovery point if the caller still holds the fence. The key's row
-- lock orders it against a takeover: no checkpoint lands after one.
CREATE OR REPLACE FUNCTION sekali.save_checkpoint(p_queue text, p_key text, p_fence bigint,
                                                  p_name text, p_value text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM sekali.idempotency_keys
      WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'processing'
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO sekali.checkpoints (queue, key, name, value, fence)
    VALUES (p_queue, p_key, p_name, p_value, p_fence)
    ON CONFLICT (queue, key, name) DO UPDATE SET value = excluded.value, fence = excluded.fence,
                                                 created_at = now();
    RETURN true;
END
$$;
