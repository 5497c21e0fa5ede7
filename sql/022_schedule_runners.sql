-- 022: which spec each scheduler runs a schedule with, for sekalictl doctor.
--
-- A schedule's name is its identity across hosts (sql/020), so hosts that
-- run one name with different specs each enqueue their own ticks: each
-- tick once, but ticks nobody wanted. sekali.schedules keeps only the spec
-- of the last host that fired, which alternates between such hosts, so it
-- cannot show them. Here every scheduler says what it runs, about once a
-- minute, and doctor compares the recent rows.
--
-- A runner is a host name and the config file's path: a second sekalid on
-- the same host with another config is another runner, and a restart or a
-- reload of the same one overwrites its rows.

CREATE TABLE IF NOT EXISTS sekali.schedule_runners (
    name    text        NOT NULL,
    runner  text        NOT NULL,    -- host:/path/of/sekali.yaml
    spec    text        NOT NULL,    -- as sekali.schedules.spec writes it
    queue   text        NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, runner)
);

-- A scheduler's report: the schedules p_runner runs now (the three arrays
-- in step). Its rows of schedules it no longer runs go, and so does every
-- row nobody has refreshed for a day (a host taken away); the table holds
-- a row per schedule and runner, so the DELETE reads a few rows.
CREATE OR REPLACE FUNCTION sekali.schedule_runner_seen(p_runner text, p_names text[],
                                                       p_specs text[], p_queues text[])
RETURNS void LANGUAGE sql AS $$
    DELETE FROM sekali.schedule_runners
     WHERE (runner = p_runner AND name <> ALL (p_names))
        OR seen_at < now() - interval '1 day';
    INSERT INTO sekali.schedule_runners AS r (name, runner, spec, queue)
    SELECT n, p_runner, s, q FROM unnest(p_names, p_specs, p_queues) AS u (n, s, q)
    ON CONFLICT (name, runner) DO UPDATE
       SET spec = EXCLUDED.spec, queue = EXCLUDED.queue, seen_at = now();
$$;
