-- The test handler's effect table (tests/plugins/effect.c): one row per
-- committed execution, so counting rows per key counts effects.
CREATE SCHEMA IF NOT EXISTS sekali_test;
CREATE TABLE IF NOT EXISTS sekali_test.effects (
    id              bigserial PRIMARY KEY,
    queue           text      NOT NULL,
    idempotency_key text      NOT NULL,
    job_id          text      NOT NULL,
    pid             integer   NOT NULL,
    fence           bigint    NOT NULL,
    attempt         integer   NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS effects_by_key ON sekali_test.effects (queue, idempotency_key);
-- Filled by "span:MS" jobs only: the resource key and when the handler ran
-- (microseconds since the epoch), to count the jobs of a resource running at once.
ALTER TABLE sekali_test.effects ADD COLUMN IF NOT EXISTS resource text,
    ADD COLUMN IF NOT EXISTS started_us bigint, ADD COLUMN IF NOT EXISTS ended_us bigint;

-- A stand-in for an outside service in external mode: like a payment API
-- given an idempotency key, it keeps the first request per key and ignores
-- the rest. `note` says what the executing attempt found.
CREATE TABLE IF NOT EXISTS sekali_test.payments (
    queue           text    NOT NULL,
    idempotency_key text    NOT NULL,
    fence           bigint  NOT NULL,
    pid             integer NOT NULL,
    note            text    NOT NULL,
    PRIMARY KEY (queue, idempotency_key)
);

-- Rows that "occ:NAME" jobs race on: each job adds 1 to total, guarded by
-- version (optimistic concurrency), so total is the number of jobs that
-- committed, whatever the interleaving.
CREATE TABLE IF NOT EXISTS sekali_test.occ_rows (
    name    text   PRIMARY KEY,
    total   bigint NOT NULL DEFAULT 0,
    version bigint NOT NULL DEFAULT 0
);

-- The queued handler's rows (tests/plugins/queued.c): one per job, its
-- INSERT sent with the COMMIT; gap_ms is how long after the transaction's
-- BEGIN it ran. The primary key makes a second INSERT of a key fail.
CREATE TABLE IF NOT EXISTS sekali_test.queued_effects (
    queue  text   NOT NULL,
    key    text   NOT NULL,
    gap_ms float8 NOT NULL,
    PRIMARY KEY (queue, key)
);

-- Rows leaving sekali.finished_keys (sql/040), per statement and queue: an
-- archived key brought back by a claim (or, past its retention, purged).
-- What proves that a test's duplicates really met archived keys, which the
-- janitor may archive again a second later.
CREATE TABLE IF NOT EXISTS sekali_test.finished_key_deletes (
    queue text   NOT NULL,
    n     bigint NOT NULL
);
CREATE OR REPLACE FUNCTION sekali_test.count_finished_key_deletes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sekali_test.finished_key_deletes SELECT queue, count(*) FROM gone GROUP BY queue;
    RETURN NULL;
END
$$;
DO $$
BEGIN
    IF to_regclass('sekali.finished_keys') IS NOT NULL THEN
        CREATE OR REPLACE TRIGGER count_finished_key_deletes AFTER DELETE ON sekali.finished_keys
            REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
            EXECUTE FUNCTION sekali_test.count_finished_key_deletes();
    END IF;
END
$$;
