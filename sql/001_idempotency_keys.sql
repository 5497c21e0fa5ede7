-- 001: the idempotency store, the final proof that a job's effect happened once.
--
-- One row per (queue, key). A worker claims the row in the same transaction
-- in which the handler writes the business effect and the row is marked
-- completed; a crash before COMMIT rolls both back, a crash after COMMIT leaves
-- a completed row that turns every redelivery into a counted duplicate.

CREATE SCHEMA IF NOT EXISTS sekali;

CREATE TABLE IF NOT EXISTS sekali.idempotency_keys (
    queue        text        NOT NULL,
    key          text        NOT NULL,
    status       text        NOT NULL CHECK (status IN ('processing', 'completed', 'failed')),
    -- Fencing token: grows by one on every claim, so a completion can prove
    -- that nobody claimed the key after it did.
    fence        bigint      NOT NULL,
    owner        text,                      -- host:pid of the claiming worker
    lease_until  timestamptz,               -- external mode: PostgreSQL's clock decides
    attempts     integer     NOT NULL DEFAULT 0,
    duplicates   bigint      NOT NULL DEFAULT 0,  -- deliveries that found the key finished
    job_id       text,
    job_type     text,
    result       bytea,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    PRIMARY KEY (queue, key)
);

-- Claims a key for the calling transaction and locks its row until COMMIT.
-- A new or unfinished key gets the next fence and one more attempt; a
-- completed or failed key is left as it is and only counted as a duplicate.
-- A concurrent claim of the same key waits here for the first transaction,
-- then sees its outcome: that wait is what serialises duplicates.
CREATE OR REPLACE FUNCTION sekali.claim(p_queue text, p_key text, p_owner text,
                                        p_job_id text, p_job_type text,
                                        OUT claimed_status text, OUT claimed_fence bigint,
                                        OUT claimed_attempts integer)
LANGUAGE plpgsql AS $$
BEGIN
    -- plpgsql rather than sql: it keeps the INSERT's plan across calls.
    INSERT INTO sekali.idempotency_keys AS k
           (queue, key, status, fence, owner, attempts, job_id, job_type)
    VALUES (p_queue, p_key, 'processing', 1, p_owner, 1, p_job_id, p_job_type)
    ON CONFLICT (queue, key) DO UPDATE SET
        fence      = k.fence      + CASE WHEN k.status = 'processing' THEN 1 ELSE 0 END,
        attempts   = k.attempts   + CASE WHEN k.status = 'processing' THEN 1 ELSE 0 END,
        duplicates = k.duplicates + CASE WHEN k.status = 'processing' THEN 0 ELSE 1 END,
        owner      = CASE WHEN k.status = 'processing' THEN excluded.owner ELSE k.owner END,
        job_id     = CASE WHEN k.status = 'processing' THEN excluded.job_id ELSE k.job_id END,
        updated_at = now()
    RETURNING k.status, k.fence, k.attempts
         INTO claimed_status, claimed_fence, claimed_attempts;
END
$$;

-- Marks a claimed key completed. Raises (and so aborts the transaction with
-- the handler's effect in it) unless the caller still holds the newest fence.
CREATE OR REPLACE FUNCTION sekali.complete(p_queue text, p_key text, p_fence bigint,
                                           p_result bytea)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sekali.idempotency_keys
       SET status = 'completed', result = p_result, error = NULL,
           completed_at = now(), updated_at = now()
     WHERE queue = p_queue AND key = p_key AND fence = p_fence AND status = 'processing';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sekali: completion of %/% fenced out (fence %)', p_queue, p_key, p_fence
              USING ERRCODE = 'SK001';
    END IF;
END
$$;

-- Records a job that will not be run again, in its own transaction after the
-- handler's was rolled back. A completed key is never downgraded.
CREATE OR REPLACE FUNCTION sekali.fail(p_queue text, p_key text, p_owner text,
                                       p_job_id text, p_job_type text, p_error text)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO sekali.idempotency_keys AS k
           (queue, key, status, fence, owner, attempts, job_id, job_type, error)
    VALUES (p_queue, p_key, 'failed', 1, p_owner, 1, p_job_id, p_job_type, p_error)
    ON CONFLICT (queue, key) DO UPDATE SET
        status = 'failed', error = excluded.error, owner = excluded.owner,
        fence = k.fence + 1, updated_at = now()
    WHERE k.status <> 'completed'
$$;
