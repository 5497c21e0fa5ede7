-- 040: finished keys in a narrow table of their own (issue 44).
--
-- A completed key must be kept for the whole retention (720 h by default),
-- but what protects against a late duplicate is only that the key finished:
-- its worker, its job's id and type, its attempts, its timestamps of claim
-- and the text of the key itself matter to `trace` for a while, and to
-- nothing afterwards. Measured on a 100 M-key store, a completed row cost
-- 306 bytes (206.7 heap, 67.9 primary key, 31.6 expiry index), and every
-- new key's INSERT probed a 6.8 GB primary key that no memory held.
--
-- The janitor now moves completed keys older than janitor.archive_after
-- (an hour by default) into sekali.finished_keys: the queue, 16 bytes of
-- the key's SHA-256, the duplicate count and three times, 140-150 bytes a
-- key (and the handler's result while no reply has carried it). The other
-- table keeps the last hour of keys, and every key that is not simply
-- done: processing, failed and cancelled. A key is in one of the two
-- tables, never in both: the move is one statement, the way back one
-- transaction.
--
-- The way back: every function that creates a key's row asks, when its
-- INSERT made a new row, whether the key is archived (adopt_finished); if
-- so the new row becomes the finished key again, one more duplicate
-- counted, and the caller answers as for any finished key. The probe comes
-- after the INSERT, not before, because the INSERT is what orders a claim
-- against the janitor's move: a claim that met a row being moved waits on
-- it, and only inserts once the move committed; the probe, a statement of
-- its own under READ COMMITTED, then sees the archived row. A probe before
-- the INSERT could look while the move was still uncommitted, find
-- nothing in either table, and run the job a second time. A function that
-- looks a key up with a locking read instead (claim_lease's second look,
-- dlq_replay, cancel) gets the same order from the lock.
--
-- Two distinct keys of one queue with the same 128 bits would make the
-- second a duplicate of the first once the first is archived: about 2^-64
-- at 2^32 keys of one queue, and a producer cannot aim at another's key
-- (a second preimage of SHA-256).

CREATE TABLE IF NOT EXISTS sekali.finished_keys (
    duplicates   bigint      NOT NULL,
    completed_at timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,  -- the retention counts from here, as before
    replied_at   timestamptz,           -- the reply went out: a duplicate gets none
    result       bytea,                 -- else what a duplicate is replied (sql/003)
    queue        text        NOT NULL,
    key_id       uuid        NOT NULL,  -- sekali.key_id(key)
    PRIMARY KEY (queue, key_id)
);

CREATE INDEX IF NOT EXISTS finished_keys_expiry ON sekali.finished_keys (queue, updated_at);

-- The first 16 bytes of the key's SHA-256 (its text as UTF-8) as a uuid:
-- fixed-size, so the heap and the primary key hold 16 bytes where a text
-- key held 37 and more.
CREATE OR REPLACE FUNCTION sekali.key_id(p_key text)
RETURNS uuid LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(substr(sha256(convert_to(p_key, 'UTF8')), 1, 16), 'hex')::uuid
$$;

-- For a caller whose INSERT has just made (queue, key)'s row, and holds it:
-- if the key finished and was archived, its record leaves finished_keys and
-- the new row becomes the finished key, with one more duplicate. Returns
-- whether it did. The job id goes: the dedupe-release trigger (sql/014)
-- must not take this delivery for a completion. Two statements, the second
-- only on a hit: as one (an UPDATE joined to the DELETE), a plan made while
-- the keys table looked empty (a worker's first claims after a quiet
-- spell) scanned the whole table at every claim, since the planner cannot
-- know the DELETE finds nothing; the DELETE alone always probes the
-- primary key.
CREATE OR REPLACE FUNCTION sekali.adopt_finished(p_queue text, p_key text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    f record;
BEGIN
    DELETE FROM sekali.finished_keys
     WHERE queue = p_queue AND key_id = sekali.key_id(p_key)
    RETURNING duplicates, completed_at, replied_at, result INTO f;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE sekali.idempotency_keys
       SET status = 'completed', owner = NULL, job_id = NULL, job_type = NULL,
           lease_until = NULL, result = f.result, error = NULL, completed_at = f.completed_at,
           replied_at = f.replied_at, duplicates = f.duplicates + 1, updated_at = now()
     WHERE queue = p_queue AND key = p_key;
    RETURN true;
END
$$;

-- The same for many keys of one queue: the keys whose rows became finished.
CREATE OR REPLACE FUNCTION sekali.adopt_finished_many(p_queue text, p_keys text[])
RETURNS TABLE (key text, fence bigint, attempts integer) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        IF sekali.adopt_finished(p_queue, p_keys[i]) THEN
            RETURN QUERY SELECT k.key, k.fence, k.attempts FROM sekali.idempotency_keys k
                          WHERE k.queue = p_queue AND k.key = p_keys[i];
        END IF;
    END LOOP;
END
$$;

-- What a reader needs of a key in either table: its status, or NULL when
-- the key is in neither (never seen, or past its retention).
CREATE OR REPLACE FUNCTION sekali.key_status(p_queue text, p_key text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT k.status FROM sekali.idempotency_keys k
          WHERE k.queue = p_queue AND k.key = p_key),
        (SELECT 'completed' FROM sekali.finished_keys f
          WHERE f.queue = p_queue AND f.key_id = sekali.key_id(p_key)))
$$;

-- The janitor's move: at most p_batch completed keys of p_queue untouched
-- for p_after_ms, oldest first, each in one statement out of
-- idempotency_keys and into finished_keys, with its recovery points and
-- any tombstone (which only the key's text could find later). The result
-- goes along while no reply has carried it (a duplicate asking for a reply
-- gets it), and is dropped once one has. A row a claim holds is skipped,
-- and one a claim changed meanwhile is no longer the version selected (its
-- ctid moved): neither is moved.
CREATE OR REPLACE FUNCTION sekali.archive_keys(p_queue text, p_after_ms bigint,
                                               p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    moved bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.idempotency_keys WHERE ctid IN (
            SELECT ctid FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status = 'completed'
               AND updated_at < now() - make_interval(secs => p_after_ms / 1000.0)
             ORDER BY updated_at
             LIMIT p_batch
             FOR UPDATE SKIP LOCKED)
        RETURNING queue, key, duplicates, completed_at, updated_at, replied_at, result),
    checkpoints AS (
        DELETE FROM sekali.checkpoints c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key),
    tombstones AS (
        DELETE FROM sekali.cancellations c USING gone
         WHERE c.queue = gone.queue AND c.key = gone.key),
    kept AS (
        INSERT INTO sekali.finished_keys AS f
               (queue, key_id, duplicates, completed_at, updated_at, replied_at, result)
        SELECT g.queue, sekali.key_id(g.key), g.duplicates,
               coalesce(g.completed_at, g.updated_at), g.updated_at, g.replied_at,
               CASE WHEN g.replied_at IS NULL THEN g.result END
          FROM gone g
        -- Only two keys with the same 128 bits meet here: they stay one.
        ON CONFLICT (queue, key_id) DO UPDATE SET
            duplicates = f.duplicates + excluded.duplicates,
            updated_at = greatest(f.updated_at, excluded.updated_at)
        RETURNING 1)
    SELECT count(*) INTO moved FROM kept;
    RETURN moved;
END
$$;

-- Retention of the archived keys, as sekali.purge_keys() (sql/035) does it
-- for the others: at most p_batch, oldest first, by their time index.
CREATE OR REPLACE FUNCTION sekali.purge_finished_keys(p_queue text, p_retention_ms bigint,
                                                      p_batch integer)
RETURNS bigint LANGUAGE plpgsql
SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM sekali.finished_keys WHERE ctid IN (
            SELECT ctid FROM sekali.finished_keys
             WHERE queue = p_queue
               AND updated_at < now() - make_interval(secs => p_retention_ms / 1000.0)
             ORDER BY updated_at
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$$;

-- The claims, each as before (sql/001, 002, 016, 017) and then the probe
-- for an archived key where the INSERT made a new row: a new row is the
-- one with fence 1 (a row that existed gets a higher one), so a claim of
-- a key already in idempotency_keys, the retries and duplicates of the
-- last hour, probes nothing.

CREATE OR REPLACE FUNCTION sekali.claim(p_queue text, p_key text, p_owner text,
                                        p_job_id text, p_job_type text,
                                        OUT claimed_status text, OUT claimed_fence bigint,
                                        OUT claimed_attempts integer)
LANGUAGE plpgsql AS $$
BEGIN
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
    IF claimed_fence = 1 AND claimed_status = 'processing' THEN
        IF sekali.adopt_finished(p_queue, p_key) THEN
            claimed_status := 'completed';
        END IF;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION sekali.claim_completed(p_queue text, p_key text, p_owner text,
                                                  p_job_id text, p_job_type text,
                                                  OUT claimed_status text,
                                                  OUT claimed_fence bigint,
                                                  OUT claimed_attempts integer)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sekali.idempotency_keys AS k
           (queue, key, status, fence, owner, attempts, job_id, job_type, completed_at)
    VALUES (p_queue, p_key, 'completed', 1, p_owner, 1, p_job_id, p_job_type, now())
    ON CONFLICT (queue, key) DO UPDATE SET
        status = 'completed', fence = k.fence + 1, attempts = k.attempts + 1,
        owner = excluded.owner, job_id = excluded.job_id, result = NULL, error = NULL,
        completed_at = now(), updated_at = now()
    WHERE k.status = 'processing'
    RETURNING 'processing', k.fence, k.attempts
         INTO claimed_status, claimed_fence, claimed_attempts;
    IF FOUND THEN
        IF claimed_fence = 1 THEN
            IF sekali.adopt_finished(p_queue, p_key) THEN
                claimed_status := 'completed';
            END IF;
        END IF;
        RETURN;
    END IF;
    UPDATE sekali.idempotency_keys SET duplicates = duplicates + 1, updated_at = now()
     WHERE queue = p_queue AND key = p_key
    RETURNING status, fence, attempts INTO claimed_status, claimed_fence, claimed_attempts;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sekali: claim_completed(%/%) lost track of its key', p_queue, p_key;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION sekali.claim_completing(p_queue text, p_keys text[], p_owner text,
                                                   p_job_ids text[], p_job_types text[])
RETURNS TABLE (ord integer, claimed_status text, claimed_fence bigint,
               claimed_attempts integer)
LANGUAGE plpgsql AS $$
DECLARE
    claimed_keys text[] := '{}';
    fences bigint[];
    tries integer[];
    adopted_keys text[] := '{}';
    adopted_fences bigint[];
    adopted_tries integer[];
    dup_keys text[] := '{}';
    dup_statuses text[];
    dup_fences bigint[];
    dup_tries integer[];
BEGIN
    WITH claimed AS (
        INSERT INTO sekali.idempotency_keys AS k
               (queue, key, status, fence, owner, attempts, job_id, job_type, completed_at)
        SELECT p_queue, u.key, 'completed', 1, p_owner, 1, u.job_id, u.job_type, now()
          FROM unnest(p_keys, p_job_ids, p_job_types) AS u(key, job_id, job_type)
        ON CONFLICT (queue, key) DO UPDATE SET
            status = 'completed', fence = k.fence + 1, attempts = k.attempts + 1,
            owner = excluded.owner, job_id = excluded.job_id, result = NULL, error = NULL,
            completed_at = now(), updated_at = now()
        WHERE k.status = 'processing'
        RETURNING k.key, k.fence, k.attempts)
    SELECT coalesce(array_agg(c.key), '{}'), array_agg(c.fence), array_agg(c.attempts)
      INTO claimed_keys, fences, tries
      FROM claimed c;

    -- The new rows (fence 1) of keys archived long ago are duplicates.
    IF 1 = ANY (fences) THEN
        SELECT coalesce(array_agg(a.key), '{}'), array_agg(a.fence), array_agg(a.attempts)
          INTO adopted_keys, adopted_fences, adopted_tries
          FROM sekali.adopt_finished_many(
                   p_queue, ARRAY(SELECT c.key FROM unnest(claimed_keys, fences) AS c(key, fence)
                                   WHERE c.fence = 1)) a;
        IF cardinality(adopted_keys) > 0 THEN
            SELECT coalesce(array_agg(c.key ORDER BY c.i), '{}'),
                   array_agg(c.fence ORDER BY c.i), array_agg(c.try ORDER BY c.i)
              INTO claimed_keys, fences, tries
              FROM unnest(claimed_keys, fences, tries) WITH ORDINALITY AS c(key, fence, try, i)
             WHERE NOT (c.key = ANY (adopted_keys));
        END IF;
    END IF;

    IF cardinality(claimed_keys) + cardinality(adopted_keys) < cardinality(p_keys) THEN
        WITH dup AS (
            UPDATE sekali.idempotency_keys
               SET duplicates = duplicates + 1, updated_at = now()
             WHERE queue = p_queue AND key = ANY (p_keys)
               AND NOT (key = ANY (claimed_keys || adopted_keys))
            RETURNING key, status, fence, attempts)
        SELECT coalesce(array_agg(d.key), '{}'), array_agg(d.status), array_agg(d.fence),
               array_agg(d.attempts)
          INTO dup_keys, dup_statuses, dup_fences, dup_tries
          FROM dup d;
    END IF;
    IF cardinality(claimed_keys) + cardinality(adopted_keys) + cardinality(dup_keys)
       <> cardinality(p_keys) THEN
        RAISE EXCEPTION 'sekali: claim_completing(%) lost track of a key', p_queue;
    END IF;
    dup_keys := dup_keys || adopted_keys;
    dup_statuses := dup_statuses || array_fill('completed'::text,
                                               ARRAY[cardinality(adopted_keys)]);
    dup_fences := dup_fences || adopted_fences;
    dup_tries := dup_tries || adopted_tries;

    RETURN QUERY
        SELECT u.i::integer,
               CASE WHEN c.i IS NOT NULL THEN 'processing' ELSE dup_statuses[d.i] END,
               CASE WHEN c.i IS NOT NULL THEN fences[c.i] ELSE dup_fences[d.i] END,
               CASE WHEN c.i IS NOT NULL THEN tries[c.i] ELSE dup_tries[d.i] END
          FROM unnest(p_keys) WITH ORDINALITY AS u(key, i),
               LATERAL array_position(claimed_keys, u.key) AS c(i),
               LATERAL array_position(dup_keys, u.key) AS d(i);
END
$$;

-- sql/002's, and two changes: a row that went between the INSERT and the
-- look at it (archived or purged meanwhile) is inserted again rather than
-- taken for a claim, and a new row is probed for an archived key.
CREATE OR REPLACE FUNCTION sekali.claim_lease(p_queue text, p_key text, p_owner text,
                                              p_job_id text, p_job_type text, p_lease_ms integer,
                                              OUT claimed_status text, OUT claimed_fence bigint,
                                              OUT claimed_attempts integer,
                                              OUT lease_left_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    k sekali.idempotency_keys%ROWTYPE;
BEGIN
    LOOP
        INSERT INTO sekali.idempotency_keys
               (queue, key, status, fence, owner, attempts, job_id, job_type, lease_until)
        VALUES (p_queue, p_key, 'processing', 1, p_owner, 1, p_job_id, p_job_type,
                now() + make_interval(secs => p_lease_ms / 1000.0))
        ON CONFLICT (queue, key) DO NOTHING;
        IF FOUND THEN
            claimed_fence := 1; claimed_attempts := 1;
            IF sekali.adopt_finished(p_queue, p_key) THEN
                claimed_status := 'completed';
            ELSE
                claimed_status := 'processing'; lease_left_ms := p_lease_ms;
            END IF;
            RETURN;
        END IF;
        SELECT * INTO k FROM sekali.idempotency_keys
         WHERE queue = p_queue AND key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
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

-- sql/001's: a completed key is never downgraded, archived or not.
CREATE OR REPLACE FUNCTION sekali.fail(p_queue text, p_key text, p_owner text,
                                       p_job_id text, p_job_type text, p_error text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_fence bigint;
BEGIN
    INSERT INTO sekali.idempotency_keys AS k
           (queue, key, status, fence, owner, attempts, job_id, job_type, error)
    VALUES (p_queue, p_key, 'failed', 1, p_owner, 1, p_job_id, p_job_type, p_error)
    ON CONFLICT (queue, key) DO UPDATE SET
        status = 'failed', error = excluded.error, owner = excluded.owner,
        fence = k.fence + 1, updated_at = now()
    WHERE k.status <> 'completed'
    RETURNING k.fence INTO v_fence;
    IF v_fence = 1 THEN
        PERFORM sekali.adopt_finished(p_queue, p_key);
    END IF;
END
$$;

-- sql/018's: the row a cancel creates for a key it did not find may be
-- that of an archived key, which then answers as completed.
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
    BEGIN
        INSERT INTO sekali.idempotency_keys (queue, key, status, fence, attempts, job_id,
                                             job_type)
        VALUES (p_queue, p_key, 'cancelled', 0, 0, p_job_id, p_job_type)
        ON CONFLICT (queue, key) DO NOTHING;
        IF FOUND THEN
            IF sekali.adopt_finished(p_queue, p_key) THEN
                status := 'completed';
                RETURN;
            END IF;
        END IF;
        IF FOUND AND NOT p_create THEN
            RAISE EXCEPTION 'probe' USING ERRCODE = 'SK003';
        END IF;
        status := CASE WHEN FOUND THEN '' END;
    EXCEPTION WHEN SQLSTATE 'SK003' THEN
        status := 'absent';
    END;
END
$$;

-- sql/007's: an archived key completed, and is not replayed. The locking
-- read of the key's row orders this against the janitor's move (a move in
-- flight holds the row until it commits), so the look into finished_keys,
-- a statement after it, sees a key the move took.
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
    v_done   timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || '/' || p_key, 7));
    SELECT * INTO k FROM sekali.idempotency_keys
     WHERE queue = p_queue AND key = p_key FOR UPDATE;
    v_found := FOUND;
    IF NOT v_found THEN
        SELECT f.completed_at INTO v_done FROM sekali.finished_keys f
         WHERE f.queue = p_queue AND f.key_id = sekali.key_id(p_key);
        IF FOUND THEN
            outcome := 'completed';
            detail := format('the key completed at %s', v_done);
            RETURN;
        END IF;
    END IF;

    SELECT * INTO v_prior FROM sekali.dlq_audit a
     WHERE a.action = 'replay' AND a.queue = p_queue AND a.key = p_key
       AND a.dead_job_id = p_dead_job_id
     ORDER BY a.id DESC LIMIT 1;
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

-- sql/007's readers of a dead letter's key, an archived key as completed.
CREATE OR REPLACE FUNCTION sekali.dlq_key_state(p_queue text, p_key text,
                                                OUT status text, OUT attempts integer,
                                                OUT error text, OUT updated_at timestamptz,
                                                OUT crashes integer, OUT replays bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(k.status, CASE WHEN f.key_id IS NOT NULL THEN 'completed' END, 'absent'),
           k.attempts, k.error, coalesce(k.updated_at, f.updated_at),
           (SELECT c.crashes FROM sekali.job_crashes c WHERE c.queue = p_queue AND c.key = p_key),
           (SELECT count(*) FROM sekali.dlq_audit a
             WHERE a.queue = p_queue AND a.key = p_key AND a.action = 'replay')
      FROM (SELECT 1) one
      LEFT JOIN sekali.idempotency_keys k ON k.queue = p_queue AND k.key = p_key
      LEFT JOIN sekali.finished_keys f
             ON k.key IS NULL AND f.queue = p_queue AND f.key_id = sekali.key_id(p_key)
$$;

CREATE OR REPLACE FUNCTION sekali.dlq_purge(p_queue text, p_key text, p_dead_job_id text,
                                            p_reason text, p_error text, p_actor text,
                                            p_os_user text)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO sekali.dlq_audit (actor, os_user, action, queue, key, dead_job_id, reason, error,
                                  old_status, old_attempts, old_crashes)
    SELECT p_actor, p_os_user, 'purge', p_queue, p_key, p_dead_job_id, p_reason,
           coalesce(k.error, p_error),
           CASE WHEN p_key IS NULL THEN NULL
                ELSE coalesce(sekali.key_status(p_queue, p_key), 'absent') END,
           k.attempts,
           (SELECT c.crashes FROM sekali.job_crashes c WHERE c.queue = p_queue AND c.key = p_key)
      FROM (SELECT 1) one
      LEFT JOIN sekali.idempotency_keys k ON k.queue = p_queue AND k.key = p_key
    RETURNING id
$$;

-- sql/020's, a schedule's last run in either table.
CREATE OR REPLACE FUNCTION sekali.schedule_status()
RETURNS TABLE (name text, spec text, queue text, last_tick bigint, last_key text,
               last_state text, enqueued bigint, dropped bigint, now bigint)
LANGUAGE sql STABLE AS $$
    SELECT s.name, s.spec, s.queue, extract(epoch FROM s.last_tick)::int8, s.last_key,
           CASE WHEN s.last_key IS NULL THEN NULL
                ELSE coalesce(sekali.key_status(s.queue, s.last_key),
                              CASE WHEN o.published_at IS NOT NULL THEN 'published'
                                   WHEN o.publish_error IS NOT NULL THEN 'unroutable'
                                   WHEN o.id IS NOT NULL THEN 'enqueued' END,
                              'gone') END,
           s.enqueued, s.dropped, floor(extract(epoch FROM now()))::int8
      FROM sekali.schedules s
      LEFT JOIN sekali.outbox o ON o.job_id = s.last_job_id
     ORDER BY s.name
$$;

-- sql/028's sekalictl trace, and an archived key: found by its key_id in
-- each queue of finished_keys, skipped through as the other table is.
CREATE OR REPLACE FUNCTION sekali.trace(p_key text, p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, at timestamptz, seq integer, source text, event text, detail text)
LANGUAGE sql STABLE SET jit = off AS $$
    -- The key in every queue: the queues are found by skipping through the
    -- primary key (one probe per queue), then the key is one probe in each.
    -- A lookup by key alone could not use the primary key (queue comes
    -- first) and read every retained key.
    WITH RECURSIVE queues(queue) AS (
        SELECT coalesce(p_queue, (SELECT min(i.queue) FROM sekali.idempotency_keys i))
        UNION ALL
        SELECT (SELECT min(i.queue) FROM sekali.idempotency_keys i WHERE i.queue > q.queue)
          FROM queues q WHERE p_queue IS NULL AND q.queue IS NOT NULL),
    keys AS MATERIALIZED (
        SELECT k.* FROM queues q JOIN sekali.idempotency_keys k
            ON k.queue = q.queue AND k.key = p_key),
    archived_queues(queue) AS (
        SELECT coalesce(p_queue, (SELECT min(f.queue) FROM sekali.finished_keys f))
        UNION ALL
        SELECT (SELECT min(f.queue) FROM sekali.finished_keys f WHERE f.queue > q.queue)
          FROM archived_queues q WHERE p_queue IS NULL AND q.queue IS NOT NULL),
    archived AS MATERIALIZED (
        SELECT f.* FROM archived_queues q JOIN sekali.finished_keys f
            ON f.queue = q.queue AND f.key_id = sekali.key_id(p_key))
    SELECT o.queue, o.created_at, 1, 'outbox', 'enqueued',
           format('job %s, type %s, %s bytes, due %s%s', o.job_id, o.job_type,
                  octet_length(o.body), o.run_at,
                  CASE WHEN o.resource_key IS NULL THEN ''
                       ELSE ', resource ' || o.resource_key END)
      FROM sekali.outbox o
     WHERE o.idempotency_key = p_key AND (p_queue IS NULL OR o.queue = p_queue)
    UNION ALL
    SELECT o.queue, o.published_at, 2, 'outbox', 'published',
           format('job %s published to the broker by a relay', o.job_id)
      FROM sekali.outbox o
     WHERE o.idempotency_key = p_key AND (p_queue IS NULL OR o.queue = p_queue)
       AND o.published_at IS NOT NULL
    UNION ALL
    -- A refused row keeps no time of its own: shown at its due time.
    SELECT o.queue, o.run_at, 3, 'outbox', 'publish refused',
           format('job %s: %s', o.job_id, o.publish_error)
      FROM sekali.outbox o
     WHERE o.idempotency_key = p_key AND (p_queue IS NULL OR o.queue = p_queue)
       AND o.publish_error IS NOT NULL
    UNION ALL
    SELECT k.queue, k.created_at, 4, 'key', 'claimed',
           format('first claim: job %s, type %s', k.job_id, k.job_type)
      FROM keys k
    UNION ALL
    SELECT k.queue, coalesce(k.completed_at, k.updated_at), 5, 'key', k.status,
           format('%s after %s attempt(s) and %s claim(s) (fence %s), owner %s, job %s%s%s',
                  k.status, k.attempts, k.fence, k.fence, coalesce(k.owner, '-'), k.job_id,
                  CASE WHEN k.error IS NULL THEN '' ELSE ', error: ' || k.error END,
                  CASE WHEN k.result IS NULL THEN ''
                       ELSE format(', result %s bytes', octet_length(k.result)) END)
      FROM keys k
    UNION ALL
    SELECT k.queue, k.replied_at, 6, 'key', 'reply sent', 'the reply was published'
      FROM keys k
     WHERE k.replied_at IS NOT NULL
    UNION ALL
    SELECT k.queue, k.updated_at, 7, 'key', 'duplicates',
           format('%s duplicate deliver%s acked without running the handler, the last now',
                  k.duplicates, CASE WHEN k.duplicates = 1 THEN 'y' ELSE 'ies' END)
      FROM keys k
     WHERE k.duplicates > 0
    UNION ALL
    SELECT a.queue, a.completed_at, 5, 'key', 'completed',
           'completed; archived (sql/040): its worker, job and attempts are no longer kept'
      FROM archived a
    UNION ALL
    SELECT a.queue, a.replied_at, 6, 'key', 'reply sent', 'the reply was published'
      FROM archived a
     WHERE a.replied_at IS NOT NULL
    UNION ALL
    SELECT a.queue, a.updated_at, 7, 'key', 'duplicates',
           format('%s duplicate deliver%s acked without running the handler, the last now',
                  a.duplicates, CASE WHEN a.duplicates = 1 THEN 'y' ELSE 'ies' END)
      FROM archived a
     WHERE a.duplicates > 0
    UNION ALL
    SELECT c.queue, c.last_crash, 8, 'crashes', 'crashed',
           format('its worker died running it %s time(s), the last now', c.crashes)
      FROM sekali.job_crashes c
     WHERE c.key = p_key AND (p_queue IS NULL OR c.queue = p_queue)
    UNION ALL
    SELECT a.queue, a.at, 9, 'dlq_audit', 'dead letter ' || a.action,
           format('by %s (OS user %s): reason %s, key was %s after %s attempt(s), %s crash(es)%s',
                  a.actor, a.os_user, coalesce(a.reason, '-'), coalesce(a.old_status, '-'),
                  coalesce(a.old_attempts::text, '-'), coalesce(a.old_crashes::text, '-'),
                  CASE WHEN a.new_job_id IS NULL THEN '' ELSE ', new job ' || a.new_job_id END)
      FROM sekali.dlq_audit a
     WHERE a.key = p_key AND (p_queue IS NULL OR a.queue = p_queue)
$$;
