-- 029: counts kept as rows change, so that status and dlq groups cost what
-- a queue's counts cost, not what it retains (issue 44). At 10 M keys
-- status visited each failed key's heap page (4.8 s with a cold cache);
-- at a million dead letters groups scanned them all (5-7 s).
--
-- What is counted, and why it cannot become a hot row:
--   sekali.key_counts          failed keys per queue. Only a change into
--                              or out of `failed` touches it (the WHEN of
--                              the triggers is checked before any call):
--                              the per-job path, which inserts keys
--                              already completed, never does.
--                              A row trigger, so that the per-job path
--                              pays a WHEN and no call; a transaction
--                              that fails or purges n keys updates one
--                              row n times (the janitor's batch bounds n).
--   sekali.dead_letter_counts  letters and replayable letters per group
--                              (queue, reason, fingerprint), as
--                              sekalictl dlq groups shows them: statement
--                              triggers, one update per group a statement
--                              touches, however many letters it writes.
-- A failure storm writes both from every worker at once, so each is split
-- in shards by the writing session (pg_backend_pid() % 16): two workers
-- rarely wait on one row. A count is the sum of its shards; a shard may go
-- below zero (a letter counted by one session and removed by another).
-- Every transaction that changes both writes key_counts first (fail, then
-- record the letter; replay the key, then delete the letter), so shards
-- shared by two sessions cannot deadlock.
--
-- Exact, not estimated: a change and its count commit together, and a
-- reader sums the shards in its statement's snapshot. The rows that
-- existed before the triggers are counted once by sekali.recount_*()
-- (sql/030), which store a base (shard -1) taken in one snapshot with the
-- shards, and then mark the count ready in sekali.count_bases; until then
-- the readers count as before.

-- Adding a trigger locks its table against writes until this migration
-- commits, and first waits for the transactions writing it (a long
-- transactional job), with every new writer queued behind: better to give
-- up after a few seconds (rolled back; run migrate again) than to stall
-- the workers behind a long job.
SET LOCAL lock_timeout = '5s';

CREATE TABLE IF NOT EXISTS sekali.count_bases (
    what     text        PRIMARY KEY,   -- failed_keys, dead_letters
    taken_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS sekali.key_counts (
    queue  text     NOT NULL,
    shard  smallint NOT NULL,           -- -1: the base; else the writer's shard
    failed bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, shard)
);

CREATE TABLE IF NOT EXISTS sekali.dead_letter_counts (
    queue       text     NOT NULL,
    reason      text     NOT NULL,
    fingerprint text     NOT NULL,
    shard       smallint NOT NULL,
    letters     bigint   NOT NULL DEFAULT 0,
    replayable  bigint   NOT NULL DEFAULT 0,   -- letters whose malformed is NULL
    PRIMARY KEY (queue, reason, fingerprint, shard)
);

CREATE OR REPLACE FUNCTION sekali.count_failed_key() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text;
    v_delta integer;
BEGIN
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.status = 'failed') THEN
        v_queue := OLD.queue;
        v_delta := -1;
    ELSE
        v_queue := NEW.queue;
        v_delta := 1;
    END IF;
    INSERT INTO sekali.key_counts AS c (queue, shard, failed)
    VALUES (v_queue, (pg_backend_pid() % 16)::smallint, v_delta)
    ON CONFLICT (queue, shard) DO UPDATE SET failed = c.failed + excluded.failed;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS count_failed_insert ON sekali.idempotency_keys;
CREATE TRIGGER count_failed_insert AFTER INSERT ON sekali.idempotency_keys
    FOR EACH ROW WHEN (NEW.status = 'failed') EXECUTE FUNCTION sekali.count_failed_key();
DROP TRIGGER IF EXISTS count_failed_update ON sekali.idempotency_keys;
CREATE TRIGGER count_failed_update AFTER UPDATE OF status ON sekali.idempotency_keys
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       AND 'failed' IN (OLD.status, NEW.status))
    EXECUTE FUNCTION sekali.count_failed_key();
DROP TRIGGER IF EXISTS count_failed_delete ON sekali.idempotency_keys;
CREATE TRIGGER count_failed_delete AFTER DELETE ON sekali.idempotency_keys
    FOR EACH ROW WHEN (OLD.status = 'failed') EXECUTE FUNCTION sekali.count_failed_key();

-- Per statement, from its transition tables: one statement that writes a
-- million letters (an import, a bulk purge) updates each group's shard once.
-- A row trigger would update it once per letter, and in one transaction
-- every update of a row walks the versions the transaction left before it.
CREATE OR REPLACE FUNCTION sekali.count_dead_letters() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sekali.dead_letter_counts AS c
               (queue, reason, fingerprint, shard, letters, replayable)
        SELECT n.queue, n.reason, n.fingerprint, (pg_backend_pid() % 16)::smallint, count(*),
               count(*) FILTER (WHERE n.malformed IS NULL)
          FROM new_letters n GROUP BY n.queue, n.reason, n.fingerprint
         ORDER BY n.queue, n.reason, n.fingerprint
        ON CONFLICT (queue, reason, fingerprint, shard) DO UPDATE
           SET letters = c.letters + excluded.letters,
               replayable = c.replayable + excluded.replayable;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO sekali.dead_letter_counts AS c
               (queue, reason, fingerprint, shard, letters, replayable)
        SELECT o.queue, o.reason, o.fingerprint, (pg_backend_pid() % 16)::smallint, -count(*),
               -count(*) FILTER (WHERE o.malformed IS NULL)
          FROM old_letters o GROUP BY o.queue, o.reason, o.fingerprint
         ORDER BY o.queue, o.reason, o.fingerprint
        ON CONFLICT (queue, reason, fingerprint, shard) DO UPDATE
           SET letters = c.letters + excluded.letters,
               replayable = c.replayable + excluded.replayable;
    ELSE
        INSERT INTO sekali.dead_letter_counts AS c
               (queue, reason, fingerprint, shard, letters, replayable)
        SELECT d.queue, d.reason, d.fingerprint, (pg_backend_pid() % 16)::smallint,
               sum(d.letters), sum(d.replayable)
          FROM (SELECT n.queue, n.reason, n.fingerprint, 1 AS letters,
                       (n.malformed IS NULL)::integer AS replayable FROM new_letters n
                UNION ALL
                SELECT o.queue, o.reason, o.fingerprint, -1,
                       -(o.malformed IS NULL)::integer FROM old_letters o) d
         GROUP BY d.queue, d.reason, d.fingerprint
        HAVING sum(d.letters) <> 0 OR sum(d.replayable) <> 0
         ORDER BY d.queue, d.reason, d.fingerprint
        ON CONFLICT (queue, reason, fingerprint, shard) DO UPDATE
           SET letters = c.letters + excluded.letters,
               replayable = c.replayable + excluded.replayable;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS count_dead_letters_insert ON sekali.dead_letters;
CREATE TRIGGER count_dead_letters_insert AFTER INSERT ON sekali.dead_letters
    REFERENCING NEW TABLE AS new_letters
    FOR EACH STATEMENT EXECUTE FUNCTION sekali.count_dead_letters();
DROP TRIGGER IF EXISTS count_dead_letters_update ON sekali.dead_letters;
CREATE TRIGGER count_dead_letters_update AFTER UPDATE ON sekali.dead_letters
    REFERENCING OLD TABLE AS old_letters NEW TABLE AS new_letters
    FOR EACH STATEMENT EXECUTE FUNCTION sekali.count_dead_letters();
DROP TRIGGER IF EXISTS count_dead_letters_delete ON sekali.dead_letters;
CREATE TRIGGER count_dead_letters_delete AFTER DELETE ON sekali.dead_letters
    REFERENCING OLD TABLE AS old_letters
    FOR EACH STATEMENT EXECUTE FUNCTION sekali.count_dead_letters();

-- TRUNCATE fires no row trigger: it empties the counts with the table.
CREATE OR REPLACE FUNCTION sekali.count_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'idempotency_keys' THEN
        DELETE FROM sekali.key_counts;
    ELSE
        DELETE FROM sekali.dead_letter_counts;
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS count_truncated ON sekali.idempotency_keys;
CREATE TRIGGER count_truncated AFTER TRUNCATE ON sekali.idempotency_keys
    FOR EACH STATEMENT EXECUTE FUNCTION sekali.count_truncated();
DROP TRIGGER IF EXISTS count_truncated ON sekali.dead_letters;
CREATE TRIGGER count_truncated AFTER TRUNCATE ON sekali.dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION sekali.count_truncated();

-- The bases: what the table holds in one snapshot, less what the shards
-- already hold in it. Every change committed before the snapshot is in
-- both and cancels; every later one is in the shards alone. One statement
-- (one snapshot) each; run again at any time, it gives the same sums. It
-- reads every failed key (or every letter) once: sql/030 runs it outside
-- any lock, and a loader that writes with triggers off calls it after.
CREATE OR REPLACE FUNCTION sekali.recount_failed_keys() RETURNS void
LANGUAGE sql SET jit = off AS $$
    WITH k AS (SELECT queue, count(*) AS n FROM sekali.idempotency_keys
                WHERE status = 'failed' GROUP BY queue),
         c AS (SELECT queue, sum(failed) FILTER (WHERE shard >= 0) AS n
                 FROM sekali.key_counts GROUP BY queue),
         base AS (
             INSERT INTO sekali.key_counts AS b (queue, shard, failed)
             SELECT coalesce(k.queue, c.queue), -1, coalesce(k.n, 0) - coalesce(c.n, 0)
               FROM k FULL JOIN c ON c.queue = k.queue
             ON CONFLICT (queue, shard) DO UPDATE SET failed = excluded.failed
             RETURNING 1)
    INSERT INTO sekali.count_bases AS r (what)
    SELECT 'failed_keys' FROM (SELECT count(*) FROM base) b
    ON CONFLICT (what) DO UPDATE SET taken_at = now()
$$;

CREATE OR REPLACE FUNCTION sekali.recount_dead_letters() RETURNS void
LANGUAGE sql SET jit = off AS $$
    -- Holds off sekali.fold_dead_letter_counts(), which moves shards into
    -- the base this statement overwrites; the next statement's snapshot
    -- is taken after the lock.
    SELECT pg_advisory_xact_lock(hashtext('sekali.dead_letter_counts'));
    WITH d AS (SELECT queue, reason, fingerprint, count(*) AS n,
                      count(*) FILTER (WHERE malformed IS NULL) AS r
                 FROM sekali.dead_letters GROUP BY queue, reason, fingerprint),
         c AS (SELECT queue, reason, fingerprint,
                      sum(letters) FILTER (WHERE shard >= 0) AS n,
                      sum(replayable) FILTER (WHERE shard >= 0) AS r
                 FROM sekali.dead_letter_counts GROUP BY queue, reason, fingerprint),
         base AS (
             INSERT INTO sekali.dead_letter_counts AS b
                    (queue, reason, fingerprint, shard, letters, replayable)
             SELECT coalesce(d.queue, c.queue), coalesce(d.reason, c.reason),
                    coalesce(d.fingerprint, c.fingerprint), -1,
                    coalesce(d.n, 0) - coalesce(c.n, 0), coalesce(d.r, 0) - coalesce(c.r, 0)
               FROM d FULL JOIN c USING (queue, reason, fingerprint)
             ON CONFLICT (queue, reason, fingerprint, shard) DO UPDATE
                SET letters = excluded.letters, replayable = excluded.replayable
             RETURNING 1)
    INSERT INTO sekali.count_bases AS r (what)
    SELECT 'dead_letters' FROM (SELECT count(*) FROM base) b
    ON CONFLICT (what) DO UPDATE SET taken_at = now()
$$;

-- sekalictl status (replaces 028's; same results): the failed keys from
-- their counts once these are ready, else from the keys as before.
CREATE OR REPLACE FUNCTION sekali.queue_status(p_queue text,
                                               OUT processing bigint, OUT failed bigint,
                                               OUT oldest_processing_s double precision,
                                               OUT outbox_pending bigint,
                                               OUT outbox_refused bigint,
                                               OUT outbox_lag_s double precision)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT (SELECT count(*) FROM sekali.idempotency_keys
             WHERE queue = p_queue AND status = 'processing'),
           CASE WHEN EXISTS (SELECT 1 FROM sekali.count_bases WHERE what = 'failed_keys')
                THEN (SELECT coalesce(sum(c.failed), 0)::bigint FROM sekali.key_counts c
                       WHERE c.queue = p_queue)
                ELSE (SELECT count(*) FROM sekali.idempotency_keys
                       WHERE queue = p_queue AND status = 'failed') END,
           (SELECT extract(epoch FROM now() - min(created_at))::float8
              FROM sekali.idempotency_keys WHERE queue = p_queue AND status = 'processing'),
           o.pending, o.refused, o.lag
    FROM (SELECT count(*) FILTER (WHERE publish_error IS NULL AND run_at <= now()) AS pending,
                 count(*) FILTER (WHERE publish_error IS NOT NULL) AS refused,
                 coalesce(extract(epoch FROM now() - min(run_at)
                          FILTER (WHERE publish_error IS NULL AND run_at <= now()))::float8, 0)
                     AS lag
          FROM sekali.outbox WHERE published_at IS NULL AND queue = p_queue) o
$$;

-- The dead letters of a queue (sekalictl status), from their counts once
-- these are ready.
CREATE OR REPLACE FUNCTION sekali.dead_letter_count(p_queue text) RETURNS bigint
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM sekali.count_bases WHERE what = 'dead_letters')
                THEN (SELECT coalesce(sum(c.letters), 0)::bigint
                        FROM sekali.dead_letter_counts c WHERE c.queue = p_queue)
                ELSE (SELECT count(*) FROM sekali.dead_letters d WHERE d.queue = p_queue) END
$$;

-- sekalictl dlq groups: the largest p_limit groups with their counts, the
-- first and last failure and the key of the group's newest letter (an
-- example to open; NULL when that letter has none), and the queue's total.
-- The counts come from dead_letter_counts once ready; the times and the
-- key from one probe each of sql/030's indexes per group shown.
CREATE OR REPLACE FUNCTION sekali.dlq_groups(p_queue text, p_limit integer)
RETURNS TABLE (reason text, fingerprint text, letters bigint, replayable bigint,
               first_failure timestamptz, last_failure timestamptz, example_key text,
               total bigint)
LANGUAGE plpgsql STABLE SET jit = off AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sekali.count_bases b WHERE b.what = 'dead_letters') THEN
        RETURN QUERY
        SELECT d.reason, d.fingerprint, count(*), count(*) FILTER (WHERE d.malformed IS NULL),
               min(coalesce(d.first_failure, d.failed_at)), max(d.failed_at), min(d.key),
               sum(count(*)) OVER ()::bigint
          FROM sekali.dead_letters d WHERE d.queue = p_queue
         GROUP BY d.reason, d.fingerprint
         ORDER BY count(*) DESC, d.reason, d.fingerprint LIMIT p_limit;
        RETURN;
    END IF;
    RETURN QUERY
    WITH g AS (
        SELECT c.reason, c.fingerprint, sum(c.letters)::bigint AS n,
               sum(c.replayable)::bigint AS r
          FROM sekali.dead_letter_counts c WHERE c.queue = p_queue
         GROUP BY c.reason, c.fingerprint HAVING sum(c.letters) > 0),
    top AS (
        SELECT g.*, sum(g.n) OVER ()::bigint AS total FROM g
         ORDER BY g.n DESC, g.reason, g.fingerprint LIMIT p_limit)
    SELECT t.reason, t.fingerprint, t.n, t.r, f.at, l.failed_at, l.key, t.total
      FROM top t
      LEFT JOIN LATERAL (
          SELECT coalesce(d.first_failure, d.failed_at) AS at FROM sekali.dead_letters d
           WHERE d.queue = p_queue AND d.reason = t.reason AND d.fingerprint = t.fingerprint
           ORDER BY coalesce(d.first_failure, d.failed_at) LIMIT 1) f ON true
      LEFT JOIN LATERAL (
          SELECT d.failed_at, d.key FROM sekali.dead_letters d
           WHERE d.queue = p_queue AND d.reason = t.reason AND d.fingerprint = t.fingerprint
           ORDER BY d.failed_at DESC LIMIT 1) l ON true
     ORDER BY t.n DESC, t.reason, t.fingerprint;
END
$$;

-- The janitor's: folds up to p_batch shard rows of the queue's groups into
-- their bases and drops the groups that are empty, so that the table holds
-- about one row per group with letters, not one per group and shard ever
-- written. The rows it folds are locked first (a worker's write to one
-- waits, then writes a new row), so the sums never change; rows a worker
-- holds are left for the next round. Returns the rows folded.
CREATE OR REPLACE FUNCTION sekali.fold_dead_letter_counts(p_queue text, p_batch integer)
RETURNS bigint LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_folded bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('sekali.dead_letter_counts'));
    WITH locked AS (
        SELECT c.reason, c.fingerprint, c.shard FROM sekali.dead_letter_counts c
         WHERE c.queue = p_queue AND c.shard >= 0
         ORDER BY c.reason, c.fingerprint, c.shard LIMIT p_batch
           FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM sekali.dead_letter_counts c USING locked l
         WHERE c.queue = p_queue AND c.reason = l.reason AND c.fingerprint = l.fingerprint
           AND c.shard = l.shard
        RETURNING c.reason, c.fingerprint, c.letters, c.replayable),
    folded AS (
        INSERT INTO sekali.dead_letter_counts AS b
               (queue, reason, fingerprint, shard, letters, replayable)
        SELECT p_queue, g.reason, g.fingerprint, -1, sum(g.letters), sum(g.replayable)
          FROM gone g GROUP BY g.reason, g.fingerprint
        ON CONFLICT (queue, reason, fingerprint, shard) DO UPDATE
           SET letters = b.letters + excluded.letters,
               replayable = b.replayable + excluded.replayable
        RETURNING 1)
    SELECT count(*) INTO v_folded FROM gone;
    -- A statement of its own, so that it sees the bases just written.
    DELETE FROM sekali.dead_letter_counts c
     WHERE c.queue = p_queue AND c.shard = -1 AND c.letters = 0 AND c.replayable = 0;
    RETURN v_folded;
END
$$;
