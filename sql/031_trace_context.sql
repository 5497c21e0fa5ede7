-- 031: W3C trace context through the outbox.
--
-- A job enqueued inside a traced request carries the request's trace: the
-- caller sets the transaction-local settings sekali.traceparent (and
-- sekali.tracestate) before sekali.enqueue() --
--     SELECT set_config('sekali.traceparent', '00-<trace>-<span>-01', true);
-- -- and the row takes them; the relay publishes them as the headers
-- traceparent and tracestate, which the worker checks strictly (a broken
-- value is dropped and counted there, so it is stored here as given). The
-- stock SQL handler sets both for each job's transaction, and sekalid's
-- scheduler for each tick, so the jobs they enqueue continue their trace.
-- Through settings and a trigger rather than a new parameter of
-- sekali.enqueue(): every caller (sekali.schedule_fire() too) passes the
-- trace on unchanged, and no call of the old shape changes meaning.
ALTER TABLE sekali.outbox ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE sekali.outbox ADD COLUMN IF NOT EXISTS tracestate text;

-- Bounded so that a runaway setting cannot make a message the broker or
-- the worker's max_headers refuses: a traceparent is 55 bytes (a later
-- version a little more), a tracestate the worker keeps is at most 512.
CREATE OR REPLACE FUNCTION sekali.outbox_take_trace()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_parent text := current_setting('sekali.traceparent', true);
    v_state  text := current_setting('sekali.tracestate', true);
BEGIN
    IF octet_length(v_parent) BETWEEN 1 AND 256 THEN
        NEW.traceparent := v_parent;
        IF octet_length(v_state) BETWEEN 1 AND 1024 THEN
            NEW.tracestate := v_state;
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- Untraced inserts skip the function: a WHEN clause costs no PL/pgSQL call.
-- A setting never set in the session reads NULL; one reset at a
-- transaction's end reads ''.
DROP TRIGGER IF EXISTS outbox_take_trace ON sekali.outbox;
CREATE TRIGGER outbox_take_trace BEFORE INSERT ON sekali.outbox
    FOR EACH ROW
    WHEN (NEW.traceparent IS NULL AND current_setting('sekali.traceparent', true) <> '')
    EXECUTE FUNCTION sekali.outbox_take_trace();

-- The trace context of an outbox row the relay has just claimed, read
-- beside sekali.claim_outbox()'s columns as sekali.outbox_priority() is
-- (volatile for the same reason: see 019).
CREATE OR REPLACE FUNCTION sekali.outbox_traceparent(p_id bigint)
RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT traceparent FROM sekali.outbox WHERE id = p_id
$$;
CREATE OR REPLACE FUNCTION sekali.outbox_tracestate(p_id bigint)
RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT tracestate FROM sekali.outbox WHERE id = p_id
$$;
