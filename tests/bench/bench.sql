-- The benchmark's effect table (tests/bench/bench_handler.c and job.pgbench).
--
-- One row per committed execution, like the test suites' effects table, so
-- counting rows per key counts effects. published_us is the producer's
-- CLOCK_REALTIME in microseconds (0 from pgbench) and committed is
-- clock_timestamp() inside the job's transaction: their difference is the
-- end-to-end latency of a job. Deliberately no unique constraint on the key:
-- a doubled effect must show up as two rows, not be hidden by a constraint
-- violation and a retry. And no index: the worker's and pgbench's per-job
-- work is one heap insert, and the checks are one scan per run.
CREATE SCHEMA IF NOT EXISTS sekali_bench;
CREATE TABLE IF NOT EXISTS sekali_bench.jobs (
    queue        text        NOT NULL,
    key          text        NOT NULL,
    published_us bigint      NOT NULL,
    committed    timestamptz NOT NULL
);
