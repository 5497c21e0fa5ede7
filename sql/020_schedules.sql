-- 020: periodic jobs (schedules: in sekali.yaml; docs/schedules.md).
--
-- One row per schedule name holds its last tick: the newest tick any host
-- has dealt with (enqueued, or dropped by the missed policy). A scheduler
-- locks the row, reads PostgreSQL's clock, enqueues the ticks due after
-- last_tick through sekali.enqueue() and moves last_tick, all in one
-- transaction: any number of hosts may try, their transactions queue on
-- the row lock, and whoever comes second finds nothing left to do. The key
-- of each tick's job is schedule:<name>:<tick in UTC, ISO 8601>, also its
-- dedupe key, so even a row reset by hand cannot make a second job of a
-- tick that is still waiting, and the consumer's idempotency row absorbs
-- one that ran.

CREATE TABLE IF NOT EXISTS sekali.schedules (
    name        text        PRIMARY KEY,
    spec        text        NOT NULL,    -- as the last host to write it had it configured
    queue       text        NOT NULL,
    last_tick   timestamptz NOT NULL,
    last_key    text,                    -- the last tick's job: its key and job id
    last_job_id text,
    enqueued    bigint      NOT NULL DEFAULT 0,
    dropped     bigint      NOT NULL DEFAULT 0,   -- due ticks left out by missed: or its bounds
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The first sight of a schedule: it starts now, with no history to catch
-- up on. Returns nothing; the caller locks and reads the row next.
CREATE OR REPLACE FUNCTION sekali.schedule_open(p_name text, p_spec text, p_queue text)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO sekali.schedules (name, spec, queue, last_tick)
    VALUES (p_name, p_spec, p_queue, date_trunc('second', now()))
    ON CONFLICT (name) DO NOTHING
$$;

-- Enqueues the ticks p_ticks (Unix seconds, oldest first) of a schedule
-- whose row the caller holds locked (SELECT ... FOR UPDATE), and moves its
-- last tick to p_latest. Returns how many jobs were new.
CREATE OR REPLACE FUNCTION sekali.schedule_fire(p_name text, p_spec text, p_queue text,
                                                p_job_type text, p_body bytea,
                                                p_ticks bigint[], p_latest bigint,
                                                p_dropped bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_tick   bigint;
    v_key    text;
    v_job_id text;
    v_new    integer := 0;
BEGIN
    FOREACH v_tick IN ARRAY coalesce(p_ticks, '{}') LOOP
        v_key := 'schedule:' || p_name || ':' ||
                 to_char(to_timestamp(v_tick) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
        v_job_id := sekali.enqueue(p_queue, p_job_type, p_body, v_key, v_key);
        v_new := v_new + 1;
    END LOOP;
    UPDATE sekali.schedules
       SET spec = p_spec, queue = p_queue, last_tick = to_timestamp(p_latest),
           last_key = coalesce(v_key, last_key), last_job_id = coalesce(v_job_id, last_job_id),
           enqueued = enqueued + v_new, dropped = dropped + p_dropped, updated_at = now()
     WHERE name = p_name;
    RETURN v_new;
END
$$;

-- For sekalictl schedules: each schedule's row, PostgreSQL's clock, and the
-- state of its last job: completed, failed or processing (its idempotency
-- row), else published or enqueued (its outbox row), else gone (purged by
-- retention).
CREATE OR REPLACE FUNCTION sekali.schedule_status()
RETURNS TABLE (name text, spec text, queue text, last_tick bigint, last_key text,
               last_state text, enqueued bigint, dropped bigint, now bigint)
LANGUAGE sql STABLE AS $$
    SELECT s.name, s.spec, s.queue, extract(epoch FROM s.last_tick)::int8, s.last_key,
           CASE WHEN s.last_key IS NULL THEN NULL
                ELSE coalesce(k.status,
                              CASE WHEN o.published_at IS NOT NULL THEN 'published'
                                   WHEN o.publish_error IS NOT NULL THEN 'unroutable'
                                   WHEN o.id IS NOT NULL THEN 'enqueued' END,
                              'gone') END,
           s.enqueued, s.dropped, floor(extract(epoch FROM now()))::int8
      FROM sekali.schedules s
      LEFT JOIN sekali.idempotency_keys k ON k.queue = s.queue AND k.key = s.last_key
      LEFT JOIN sekali.outbox o ON o.job_id = s.last_job_id
     ORDER BY s.name
$$;
