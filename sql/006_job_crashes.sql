-- 006: how often a job's worker died while running it.
--
-- A job that kills its worker (a crash in the handler, or a job_timeout
-- kill) is redelivered, and on a classic queue the broker says only
-- `redelivered`, never how often: without a count it would crash workers
-- for ever. The claim cannot count it, since the crash rolls the claim back.
-- So the worker that replaces a dead one records the crash here, in a
-- transaction of its own, and a redelivered job past its queue's
-- max_crashes is dead-lettered instead of run.
CREATE TABLE IF NOT EXISTS sekali.job_crashes (
    queue      text        NOT NULL,
    key        text        NOT NULL,
    crashes    integer     NOT NULL,
    last_crash timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);
-- For the janitor, which forgets old crashes.
CREATE INDEX IF NOT EXISTS job_crashes_by_time ON sekali.job_crashes (last_crash);

-- Counts one more crash of (queue, key) and returns the count.
CREATE OR REPLACE FUNCTION sekali.record_crash(p_queue text, p_key text) RETURNS integer
LANGUAGE sql AS $$
    INSERT INTO sekali.job_crashes AS c (queue, key, crashes) VALUES (p_queue, p_key, 1)
    ON CONFLICT (queue, key) DO UPDATE SET crashes = c.crashes + 1, last_crash = now()
    RETURNING crashes
$$;
