-- 018: cancellation. A cancelled job is a tombstone on its key.
--
-- The key's own row carries the state `cancelled`: every claim (claim,
-- claim_lease, claim_many, claim_completing) already treats a row that is
-- not `processing` as finished, so a later delivery of the key is acked
-- without running its handler, and no claim function changes here.
-- sekali.cancellations keeps who cancelled, why, and what the cancel found.
--
-- The one case the row cannot carry is a job running in transactional mode:
-- its transaction holds the row locked until COMMIT, and waiting for that
-- lock would only let the job commit first. There the cancel records the
-- tombstone alone, and a deferred trigger refuses the COMMIT of a key that
-- has one (SQLSTATE SK002); the worker then writes the row cancelled
-- (sekali.settle_cancelled). An advisory lock on the key orders the two:
-- the cancel takes it exclusively before it decides, the refusing trigger
-- shares it at COMMIT, so either the job committed before the cancel looked
-- (which then reports that it already ran) or the job sees the tombstone.

ALTER TABLE sekali.idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_status_check;
ALTER TABLE sekali.idempotency_keys ADD CONSTRAINT idempotency_keys_status_check
    CHECK (status IN ('processing', 'completed', 'failed', 'cancelled')) NOT VALID;
ALTER TABLE sekali.idempotency_keys VALIDATE CONSTRAINT idempotency_keys_status_check;

CREATE TABLE IF NOT EXISTS sekali.cancellations (
    queue          text        NOT NULL,
    key            text        NOT NULL,
    reason         text,                    -- bounded and without control characters
    cancelled_by   text        NOT NULL,    -- --by, or the OS or database user
    db_user        text        NOT NULL DEFAULT session_user,
    found          text        NOT NULL,    -- what the cancel found the job doing
    job_id         text,                    -- the newest outbox row's job, when known
    outbox_removed integer     NOT NULL DEFAULT 0,  -- unpublished rows taken out
    cancelled_at   timestamptz NOT NULL DEFAULT now(),
    settled_at     timestamptz,             -- when the key's row became cancelled
    PRIMARY KEY (queue, key)
);

-- A value from a user, made safe to store and print: control characters
-- (newlines, escapes, NUL cannot occur in text) become spaces, and it is cut
-- to p_max characters. NULL for NULL or nothing left.
CREATE OR REPLACE FUNCTION sekali.cancel_clean(p_value text, p_max integer)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT nullif(btrim(left(regexp_replace(p_value, '[[:cntrl:]]', ' ', 'g'), p_max)), '')
$$;

-- The advisory lock that orders a cancel against a running job's COMMIT:
-- one of 256 buckets of keys (classid 18, this migration, keeps them apart
-- from sekali's other advisory locks). Buckets, not one lock per key: every
-- COMMIT that completes keys shares the lock of each, and a transaction
-- completing thousands (a big batch, a bulk UPDATE) would otherwise fill
-- PostgreSQL's lock table ("out of shared memory"); this way it holds 256
-- at most. The price of sharing a bucket: while a cancel of a *running*
-- transactional job is uncommitted, COMMITs of the other keys of its bucket
-- wait for it (a few ms from sekalictl; as long as its transaction from a
-- producer).
CREATE OR REPLACE FUNCTION sekali.cancel_lock_id(p_queue text, p_key text)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT (18::bigint << 32) | (hashtext(p_queue || '/' || p_key) & 255)
$$;

-- One try at the key's row, waiting at most 20 ms for a lock on it (a short
-- claim, renewal or completion lets go within that; a job running in
-- transactional mode does not). Returns the status the row had, locked for
-- the caller; with no row, creates it cancelled ('' returned) when p_create,
-- else returns 'absent' (and creates nothing). NULL: a row appeared meanwhile, try again. Raises
-- lock_not_available when the row stays locked.
CREATE OR REPLACE FUNCTION sekali.cancel_take_row(p_queue text, p_key text, p_job_id text,
                                                  p_job_type text, p_create boolean,
                                                  OUT status text)
LANGUAGE plpgsql SET lock_timeout = '20ms' AS $$
BEGIN
    SELECT k.status INTO status FROM sekali.idempotency_keys k
     WHERE k.queue = p_queue AND k.key = p_key FOR UPDATE;
    IF FOUND THEN
        RETURN;
    END IF;
    -- A transaction claiming the key for the first time holds a row this
    -- SELECT cannot see: the INSERT waits for it, and lock_timeout ends the
    -- wait. Without p_create the INSERT only probes, and is undone.
    BEGIN
        INSERT INTO sekali.idempotency_keys (queue, key, status, fence, attempts, job_id,
                                             job_type)
        VALUES (p_queue, p_key, 'cancelled', 0, 0, p_job_id, p_job_type)
        ON CONFLICT (queue, key) DO NOTHING;
        IF FOUND AND NOT p_create THEN
            RAISE EXCEPTION 'probe' USING ERRCODE = 'SK003';
        END IF;
        status := CASE WHEN FOUND THEN '' END;
    EXCEPTION WHEN SQLSTATE 'SK003' THEN
        status := 'absent';
    END;
END
$$;

-- Cancels the job of (queue, key), in the caller's transaction (a producer
-- may cancel together with its refund; nothing holds until it commits).
-- p_reason and p_by are stored cleaned and bounded (500 and 100
-- characters); p_by defaults to the database user. Returns what happened:
--   cancelled          recorded: it will never run (it had not started, was
--                      in the outbox, in the queue, or waiting for a lock);
--   running            it is running: in transactional mode its COMMIT will
--                      be refused and rolled back, in external mode its
--                      outcome will not be recorded (host->cancelled() says 1);
--   already cancelled  nothing changed;
--   already completed  it ran: nothing changed;
--   already failed     it was given up (dead-lettered): nothing changed;
--   unknown            no key and no outbox row: nothing recorded, unless
--                      p_force (a job published straight to RabbitMQ is
--                      known only once delivered).
-- Unpublished outbox rows of the key are deleted, so no relay publishes them,
-- and the key's dedupe keys are released. Blocks for about 200 ms when the
-- job is running, and while a relay publishes one of the key's rows.
CREATE OR REPLACE FUNCTION sekali.cancel(p_queue text, p_key text, p_reason text DEFAULT NULL,
                                         p_by text DEFAULT NULL, p_force boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_reason   text := sekali.cancel_clean(p_reason, 500);
    v_by       text := coalesce(sekali.cancel_clean(p_by, 100), session_user);
    v_job_id   text;
    v_job_type text;
    v_outbox   boolean;
    v_status   text;
    v_lease    timestamptz;
    v_found    text;
    v_removed  integer;
    v_outcome  text := 'cancelled';
BEGIN
    IF coalesce(p_queue, '') = '' OR coalesce(p_key, '') = '' THEN
        RAISE EXCEPTION 'sekali.cancel: a queue and a key are required' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM sekali.cancellations c WHERE c.queue = p_queue AND c.key = p_key)
    THEN
        RETURN 'already cancelled';
    END IF;
    -- The outbox has no index on idempotency_key (sql/011): a cancel, which
    -- is rare, reads the table the janitor keeps short.
    SELECT o.job_id, o.job_type INTO v_job_id, v_job_type FROM sekali.outbox o
     WHERE o.queue = p_queue AND o.idempotency_key = p_key ORDER BY o.id DESC LIMIT 1;
    v_outbox := FOUND;

    FOR i IN 1 .. 11 LOOP
        IF i = 11 THEN
            -- Still locked after ~200 ms: a transaction runs the job. From
            -- here on its COMMIT waits for this transaction (the trigger
            -- shares this lock); one more look tells whether it committed
            -- before that.
            PERFORM pg_advisory_xact_lock(sekali.cancel_lock_id(p_queue, p_key));
        END IF;
        BEGIN
            v_status := sekali.cancel_take_row(p_queue, p_key, v_job_id, v_job_type,
                                               v_outbox OR p_force);
        EXCEPTION WHEN lock_not_available THEN
            v_status := 'locked';
        END;
        EXIT WHEN v_status IS DISTINCT FROM 'locked' AND v_status IS NOT NULL;
    END LOOP;

    CASE coalesce(v_status, 'locked')
    WHEN 'absent' THEN
        RETURN 'unknown';
    WHEN 'completed' THEN
        RETURN 'already completed';
    WHEN 'failed' THEN
        RETURN 'already failed';
    WHEN 'cancelled' THEN
        RETURN 'already cancelled';
    WHEN '' THEN
        v_found := CASE WHEN v_outbox THEN 'not yet run (enqueued)'
                        ELSE 'unknown key (forced)' END;
    WHEN 'processing' THEN
        SELECT k.lease_until INTO v_lease FROM sekali.idempotency_keys k
         WHERE k.queue = p_queue AND k.key = p_key;
        IF v_lease > now() THEN
            v_found := 'running (external mode): its outcome will not be recorded';
            v_outcome := 'running';
        ELSE
            v_found := 'not running (an earlier attempt did not finish)';
        END IF;
        UPDATE sekali.idempotency_keys SET status = 'cancelled', updated_at = now()
         WHERE queue = p_queue AND key = p_key;
    ELSE  -- locked
        v_found := 'running (transactional mode): its commit will be refused';
        v_outcome := 'running';
    END CASE;

    UPDATE sekali.job_dedupe SET released_at = now()
     WHERE released_at IS NULL AND job_id IN (
           SELECT o.job_id FROM sekali.outbox o
            WHERE o.queue = p_queue AND o.idempotency_key = p_key);
    DELETE FROM sekali.outbox o
     WHERE o.queue = p_queue AND o.idempotency_key = p_key AND o.published_at IS NULL;
    GET DIAGNOSTICS v_removed = ROW_COUNT;
    INSERT INTO sekali.cancellations (queue, key, reason, cancelled_by, found, job_id,
                                      outbox_removed, settled_at)
    VALUES (p_queue, p_key, v_reason, v_by, v_found, v_job_id, v_removed,
            CASE WHEN v_status = 'locked' OR v_status IS NULL THEN NULL ELSE now() END);
    RETURN v_outcome;
END
$$;

-- Whether (queue, key) is cancelled: what host->cancelled() asks.
CREATE OR REPLACE FUNCTION sekali.is_cancelled(p_queue text, p_key text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM sekali.cancellations c
                    WHERE c.queue = p_queue AND c.key = p_key)
$$;

-- After a job's COMMIT was refused (or its outcome fenced out): writes the
-- key's row cancelled if the key has a tombstone, in the caller's own
-- transaction, and says whether it had one. A completed row stays completed.
CREATE OR REPLACE FUNCTION sekali.settle_cancelled(p_queue text, p_key text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sekali.cancellations SET settled_at = coalesce(settled_at, now())
     WHERE queue = p_queue AND key = p_key;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO sekali.idempotency_keys AS k (queue, key, status, fence, attempts)
    VALUES (p_queue, p_key, 'cancelled', 0, 0)
    ON CONFLICT (queue, key) DO UPDATE SET status = 'cancelled', lease_until = NULL,
                                           updated_at = now()
     WHERE k.status = 'processing';
    RETURN true;
END
$$;

-- The fence of a job that runs while it is cancelled: at COMMIT, a key
-- becoming completed must have no tombstone. Deferred, so it runs after the
-- handler's last statement, whichever path completed the key (complete,
-- claim_completing, finish_lease, an operator at psql).
CREATE OR REPLACE FUNCTION sekali.refuse_cancelled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The lock first, always (a plain expression: plpgsql evaluates it
    -- without the executor), then the probe for the tombstone.
    PERFORM pg_advisory_xact_lock_shared(sekali.cancel_lock_id(NEW.queue, NEW.key));
    IF EXISTS (SELECT 1 FROM sekali.cancellations c
                WHERE c.queue = NEW.queue AND c.key = NEW.key) THEN
        RAISE EXCEPTION 'sekali: %/% was cancelled while it ran: its commit is refused',
              NEW.queue, NEW.key USING ERRCODE = 'SK002';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS refuse_cancelled ON sekali.idempotency_keys;
CREATE CONSTRAINT TRIGGER refuse_cancelled
    AFTER INSERT OR UPDATE OF status ON sekali.idempotency_keys
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.status = 'completed')
    EXECUTE FUNCTION sekali.refuse_cancelled();

-- The cancellation as an event of sekalictl trace, in sekali.trace()'s shape.
CREATE OR REPLACE FUNCTION sekali.trace_cancel(p_key text, p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, at timestamptz, seq integer, source text, event text, detail text)
LANGUAGE sql STABLE AS $$
    SELECT c.queue, c.cancelled_at, 10, 'cancellations', 'cancelled',
           format('by %s (database user %s): reason %s; found it %s%s%s',
                  c.cancelled_by, c.db_user, coalesce(c.reason, '-'), c.found,
                  CASE WHEN c.outbox_removed = 0 THEN ''
                       ELSE format('; %s unpublished outbox row(s) removed', c.outbox_removed)
                  END,
                  CASE WHEN c.settled_at IS NULL THEN '; not yet settled'
                       WHEN c.settled_at > c.cancelled_at + interval '1 ms'
                       THEN format('; settled %s', c.settled_at) ELSE '' END)
      FROM sekali.cancellations c
     WHERE c.key = p_key AND (p_queue IS NULL OR c.queue = p_queue)
$$;

-- Retention (replaces 012's): cancelled keys go like finished ones, and
-- their tombstones with them.
CREATE OR REPLACE FUNCTION sekali.purge_keys(p_queue text, p_retention_ms bigint,
                                             p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM sekali.idempotency_keys WHERE ctid IN (
            SELECT ctid FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status IN ('completed', 'failed', 'cancelled')
               AND updated_at < now() - make_interval(secs => p_retention_ms / 1000.0)
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
