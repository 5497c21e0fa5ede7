-- 023: PostgreSQL is the store of record for dead letters. Reading a
-- <queue>.dead through the broker hands each letter back, and a quorum
-- queue counts every hand-back against its delivery limit (RabbitMQ 4 sets
-- one by default), so reads destroyed letters. A dead letter is now a row,
-- written in the transaction that records its key `failed` (or, for a
-- letter without a recorded key, in a statement of its own before the ack);
-- sekalictl and the console read, group, page, replay and purge the rows,
-- and <queue>.dead is at most a mirror that sekali never reads.

-- The error's fingerprint: numbers and ids masked, so that letters that
-- failed for one cause group together ("gateway 503 for order 1234" and
-- "... order 1250"). A hex-and-dash word of 8 or more with a digit is an id.
CREATE OR REPLACE FUNCTION sekali.dlq_fingerprint(p_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(regexp_replace(regexp_replace(regexp_replace(coalesce(p_error, ''),
               '(?<![[:alnum:]])(?=[-0-9A-Fa-f]*[0-9])[-0-9A-Fa-f]{8,}(?![[:alnum:]])',
               '{id}', 'g'),
               '[0-9]+', '{n}', 'g'),
               '[[:space:]]+', ' ', 'g'), 159)
$$;

-- A time a producer wrote (x-sekali-first-failure), or NULL: a letter is
-- never refused for a header that does not parse.
CREATE OR REPLACE FUNCTION sekali.dlq_time(p_text text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN p_text::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

CREATE TABLE IF NOT EXISTS sekali.dead_letters (
    id            bigserial   PRIMARY KEY,
    queue         text        NOT NULL,
    key           text,                  -- NULL: a letter without a usable key (malformed)
    job_id        text,
    job_type      text,
    resource_key  text,                  -- NULL: the key is the resource
    reason        text        NOT NULL,  -- retries_exhausted, failed, malformed, ...
    error         text        NOT NULL DEFAULT '',
    fingerprint   text        GENERATED ALWAYS AS (sekali.dlq_fingerprint(error)) STORED,
    malformed     text,                  -- why it cannot be replayed; NULL: replayable
    body          bytea       NOT NULL,  -- whole, or its first bytes when body_truncated
    body_size     integer     NOT NULL,  -- the message's size
    body_truncated boolean    NOT NULL DEFAULT false,
    headers       jsonb       NOT NULL DEFAULT '{}',  -- the message's, bounded
    content_type  text,
    attempts      integer,               -- NULL: unknown
    first_failure timestamptz,
    failed_at     timestamptz NOT NULL DEFAULT now(),
    host          text,                  -- provenance: who dead-lettered it
    worker        text,
    recorded_by   text        NOT NULL DEFAULT 'sekali'
                  CHECK (recorded_by IN ('sekali', 'broker', 'unverified', 'unknown')),
    origin        text                   -- where it came from, in words
);
-- Keyset pages (list), one letter per failed key, groups and a group's
-- pages (the console's), and retention.
CREATE INDEX IF NOT EXISTS dead_letters_page ON sekali.dead_letters (queue, id);
CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_key ON sekali.dead_letters (queue, key)
    WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS dead_letters_groups
    ON sekali.dead_letters (queue, reason, fingerprint, id)
    INCLUDE (malformed, failed_at, first_failure, key);
CREATE INDEX IF NOT EXISTS dead_letters_age ON sekali.dead_letters (queue, failed_at);

-- Which letter an audited replay or purge took.
ALTER TABLE sekali.dlq_audit ADD COLUMN IF NOT EXISTS letter_id bigint;
CREATE INDEX IF NOT EXISTS dlq_audit_by_letter ON sekali.dlq_audit (letter_id)
    WHERE letter_id IS NOT NULL;

-- Records one dead letter; returns its id. A key has one letter, its
-- latest failure: a second failure of the same key (a redelivery whose ack
-- was lost) replaces the first rather than doubling it. A copy imported
-- from <queue>.dead never replaces sekali's own record of the key: then
-- nothing changes and the result is NULL.
CREATE OR REPLACE FUNCTION sekali.dlq_record(p_queue text, p_key text, p_job_id text,
                                             p_job_type text, p_resource_key text,
                                             p_reason text, p_error text, p_malformed text,
                                             p_body bytea, p_body_size integer,
                                             p_headers jsonb, p_content_type text,
                                             p_attempts integer, p_first_failure timestamptz,
                                             p_host text, p_worker text,
                                             p_recorded_by text DEFAULT 'sekali',
                                             p_origin text DEFAULT NULL,
                                             p_failed_at timestamptz DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO sekali.dead_letters AS d
           (queue, key, job_id, job_type, resource_key, reason, error, malformed, body,
            body_size, body_truncated, headers, content_type, attempts, first_failure,
            failed_at, host, worker, recorded_by, origin)
    VALUES (p_queue, p_key, p_job_id, p_job_type, p_resource_key, p_reason,
            coalesce(p_error, ''), p_malformed, p_body, p_body_size,
            length(p_body) < p_body_size, coalesce(p_headers, '{}'), p_content_type,
            p_attempts, p_first_failure, coalesce(p_failed_at, now()), p_host, p_worker,
            p_recorded_by, p_origin)
    ON CONFLICT (queue, key) WHERE key IS NOT NULL DO UPDATE SET
        job_id = excluded.job_id, job_type = excluded.job_type,
        resource_key = excluded.resource_key, reason = excluded.reason,
        error = excluded.error, malformed = excluded.malformed, body = excluded.body,
        body_size = excluded.body_size, body_truncated = excluded.body_truncated,
        headers = excluded.headers, content_type = excluded.content_type,
        attempts = excluded.attempts,
        first_failure = coalesce(d.first_failure, excluded.first_failure),
        failed_at = excluded.failed_at, host = excluded.host, worker = excluded.worker,
        recorded_by = excluded.recorded_by, origin = excluded.origin
    WHERE d.recorded_by <> 'sekali' OR excluded.recorded_by = 'sekali'
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

-- Records a job failed and its dead letter in one transaction (the
-- caller's statement): sekali.fail(), or for a leased job (p_fence not
-- NULL) sekali.finish_lease() under its fence. false: fenced out, and
-- nothing was recorded.
CREATE OR REPLACE FUNCTION sekali.fail_dead(p_queue text, p_key text, p_owner text,
                                            p_fence bigint, p_job_id text, p_job_type text,
                                            p_resource_key text, p_reason text, p_error text,
                                            p_body bytea, p_body_size integer,
                                            p_headers jsonb, p_content_type text,
                                            p_attempts integer, p_first_failure timestamptz,
                                            p_host text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF p_fence IS NULL THEN
        PERFORM sekali.fail(p_queue, p_key, p_owner, p_job_id, p_job_type, p_error);
    ELSIF NOT sekali.finish_lease(p_queue, p_key, p_fence, 'failed', NULL, p_error) THEN
        RETURN false;
    END IF;
    PERFORM sekali.dlq_record(p_queue, p_key, p_job_id, p_job_type, p_resource_key, p_reason,
                              p_error, NULL, p_body, p_body_size, p_headers, p_content_type,
                              p_attempts, p_first_failure, p_host, p_owner);
    RETURN true;
END
$$;

-- Replays one dead letter in one transaction: sekali.dlq_replay() re-arms
-- its key and enqueues its job, and the letter's row goes. The row lock
-- orders two replays of one letter: the second finds it gone and is
-- refused, so a letter is replayed exactly once. outcome is dlq_replay()'s,
-- or gone (replayed or purged before), malformed or unverified.
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
    END IF;
    IF r.outcome IN ('replayed', 'already_replayed') THEN
        DELETE FROM sekali.dead_letters WHERE id = p_id;
    END IF;
END
$$;

-- Purges one dead letter with its audit row, in one transaction; the key
-- stays as it is. false: the letter was gone already.
CREATE OR REPLACE FUNCTION sekali.dlq_purge_letter(p_id bigint, p_actor text, p_os_user text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    l sekali.dead_letters%ROWTYPE;
    v_audit bigint;
BEGIN
    DELETE FROM sekali.dead_letters WHERE id = p_id RETURNING * INTO l;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_audit := sekali.dlq_purge(l.queue, l.key, l.job_id, l.reason, l.error, p_actor, p_os_user);
    UPDATE sekali.dlq_audit SET letter_id = p_id WHERE id = v_audit;
    RETURN true;
END
$$;

-- Retention: a dead letter lives as long as its failed key. One whose key
-- is gone (purged by the janitor, or never recorded: malformed, beyond
-- retention) goes once it is older than the queue's retention. Deletes at
-- most p_batch, oldest first.
CREATE OR REPLACE FUNCTION sekali.purge_dead_letters(p_queue text, p_retention_ms bigint,
                                                     p_batch integer)
RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM sekali.dead_letters WHERE id IN (
            SELECT d.id FROM sekali.dead_letters d
             WHERE d.queue = p_queue
               AND d.failed_at < now() - make_interval(secs => p_retention_ms / 1000.0)
               AND NOT EXISTS (SELECT 1 FROM sekali.idempotency_keys k
                                WHERE k.queue = d.queue AND k.key = d.key
                                  AND k.status = 'failed')
             ORDER BY d.failed_at
             LIMIT p_batch)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;
