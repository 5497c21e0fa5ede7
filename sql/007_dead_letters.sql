-- 007: dead letters are never a dead end. sekalictl dlq replays a dead
-- letter by re-arming its key (failed -> runnable again) and re-enqueueing
-- the job through the outbox in one transaction, or purges it; both leave
-- an audit row saying who did what, when, and what the key was before.

CREATE TABLE IF NOT EXISTS sekali.dlq_audit (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,  -- --by, else the OS user
    os_user     text        NOT NULL,
    action      text        NOT NULL CHECK (action IN ('replay', 'purge')),
    queue       text        NOT NULL,
    key         text,                  -- NULL: a malformed dead letter without one
    dead_job_id text,                  -- the dead letter's message_id
    reason      text,                  -- x-sekali-reason, or the broker's x-death reason
    error       text,                  -- x-sekali-error, or the key's error
    old_status  text,                  -- the key's status before: failed, absent, ...
    old_attempts integer,
    old_crashes integer,
    new_job_id  text                   -- replay: the job id of the outbox row
);
CREATE INDEX IF NOT EXISTS dlq_audit_by_key ON sekali.dlq_audit (queue, key);

-- What PostgreSQL knows of a key, for sekalictl dlq list and show.
CREATE OR REPLACE FUNCTION sekali.dlq_key_state(p_queue text, p_key text,
                                                OUT status text, OUT attempts integer,
                                                OUT error text, OUT updated_at timestamptz,
                                                OUT crashes integer, OUT replays bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(k.status, 'absent'), k.attempts, k.error, k.updated_at,
           (SELECT c.crashes FROM sekali.job_crashes c WHERE c.queue = p_queue AND c.key = p_key),
           (SELECT count(*) FROM sekali.dlq_audit a
             WHERE a.queue = p_queue AND a.key = p_key AND a.action = 'replay')
      FROM (SELECT 1) one
      LEFT JOIN sekali.idempotency_keys k ON k.queue = p_queue AND k.key = p_key
$$;

-- Replays one dead letter, in the caller's transaction (one statement: its
-- own). outcome is
--   replayed          the key is re-armed, the job enqueued as job_id
--   already_replayed  this very dead letter was replayed before (as job_id),
--                     but its removal from <queue>.dead was lost (a crash
--                     after COMMIT): nothing is enqueued again
--   completed         refused: the key completed meanwhile
--   pending           refused: an earlier replay re-armed the key and its
--                     job has not run yet
--   running           refused: a live worker holds the key's lease
-- Re-arming keeps the row and raises its fence, so that a worker that still
-- holds an old fence (external mode, stalled) can never complete the new run;
-- the row becomes `processing` with no owner and no lease, which both claim
-- and claim_lease take over as a fresh attempt. Recovery points stay: a
-- replayed external job skips the phases its failed run finished (so its
-- attempts restart at 1 rather than 0, which makes the claim load them).
CREATE OR REPLACE FUNCTION sekali.dlq_replay(p_queue text, p_key text, p_dead_job_id text,
                                             p_job_type text, p_body bytea,
                                             p_resource_key text, p_reason text,
                                             p_error text, p_actor text, p_os_user text,
                                             OUT outcome text, OUT job_id text,
                                             OUT detail text)
LANGUAGE plpgsql AS $$
DECLARE
    k        sekali.idempotency_keys%ROWTYPE;
    v_found  boolean;
    v_prior  sekali.dlq_audit%ROWTYPE;
    v_crash  integer;
BEGIN
    -- Two operators replaying two copies of one key's dead letter at once
    -- take turns here, so the second sees what the first did.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || '/' || p_key, 7));
    SELECT * INTO k FROM sekali.idempotency_keys
     WHERE queue = p_queue AND key = p_key FOR UPDATE;
    v_found := FOUND;

    SELECT * INTO v_prior FROM sekali.dlq_audit a
     WHERE a.action = 'replay' AND a.queue = p_queue AND a.key = p_key
       AND a.dead_job_id = p_dead_job_id
     ORDER BY a.id DESC LIMIT 1;
    -- A key that failed again since that replay failed anew: this copy is
    -- a new dead letter with a reused message id, and is replayed as one.
    IF FOUND AND NOT (v_found AND k.status = 'failed' AND k.updated_at > v_prior.at) THEN
        outcome := 'already_replayed';
        job_id := v_prior.new_job_id;
        detail := format('replayed before as job %s by %s at %s', v_prior.new_job_id,
                         v_prior.actor, v_prior.at);
        RETURN;
    END IF;

    IF v_found AND k.status = 'completed' THEN
        outcome := 'completed';
        detail := format('the key completed at %s', k.completed_at);
        RETURN;
    END IF;
    IF v_found AND k.status = 'processing' AND k.owner IS NULL THEN
        outcome := 'pending';
        detail := format('an earlier replay re-armed the key as job %s, not run yet', k.job_id);
        RETURN;
    END IF;
    IF v_found AND k.status = 'processing' AND k.lease_until > now() THEN
        outcome := 'running';
        detail := format('worker %s holds the key''s lease until %s', k.owner, k.lease_until);
        RETURN;
    END IF;

    SELECT c.crashes INTO v_crash FROM sekali.job_crashes c
     WHERE c.queue = p_queue AND c.key = p_key;
    DELETE FROM sekali.job_crashes WHERE queue = p_queue AND key = p_key;
    job_id := sekali.enqueue(p_queue, p_job_type, p_body, p_key, NULL, p_resource_key);
    IF v_found THEN
        UPDATE sekali.idempotency_keys i
           SET status = 'processing', owner = NULL, lease_until = NULL, error = NULL,
               result = NULL, completed_at = NULL, fence = i.fence + 1, job_id = dlq_replay.job_id,
               attempts = CASE WHEN EXISTS (SELECT 1 FROM sekali.checkpoints c
                                             WHERE c.queue = p_queue AND c.key = p_key)
                               THEN 1 ELSE 0 END,
               updated_at = now()
         WHERE i.queue = p_queue AND i.key = p_key;
    END IF;
    INSERT INTO sekali.dlq_audit (actor, os_user, action, queue, key, dead_job_id, reason, error,
                                  old_status, old_attempts, old_crashes, new_job_id)
    VALUES (p_actor, p_os_user, 'replay', p_queue, p_key, p_dead_job_id, p_reason,
            coalesce(k.error, p_error), CASE WHEN v_found THEN k.status ELSE 'absent' END,
            k.attempts, v_crash, job_id);
    outcome := 'replayed';
    detail := CASE WHEN v_found THEN format('key was %s', k.status)
                   ELSE 'key had no row (never recorded, or past its retention)' END;
END
$$;

-- Records the purge of one dead letter; the key stays as it is (a failed
-- key stays failed). Called, and committed, before the dead letter is
-- removed, so no dead letter leaves without its audit row.
CREATE OR REPLACE FUNCTION sekali.dlq_purge(p_queue text, p_key text, p_dead_job_id text,
                                            p_reason text, p_error text, p_actor text,
                                            p_os_user text)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO sekali.dlq_audit (actor, os_user, action, queue, key, dead_job_id, reason, error,
                                  old_status, old_attempts, old_crashes)
    SELECT p_actor, p_os_user, 'purge', p_queue, p_key, p_dead_job_id, p_reason,
           coalesce(k.error, p_error),
           CASE WHEN p_key IS NULL THEN NULL ELSE coalesce(k.status, 'absent') END,
           k.attempts,
           (SELECT c.crashes FROM sekali.job_crashes c WHERE c.queue = p_queue AND c.key = p_key)
      FROM (SELECT 1) one
      LEFT JOIN sekali.idempotency_keys k ON k.queue = p_queue AND k.key = p_key
    RETURNING id
$$;
