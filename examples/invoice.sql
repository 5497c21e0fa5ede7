-- The example handler's business table.
--
-- Deliberately without UNIQUE (order_id): the demo and the tests count rows to
-- prove that sekali alone makes each order's invoice happen once. A production
-- table should add the constraint as a second line of defence.
CREATE TABLE IF NOT EXISTS invoices (
    id           bigserial   PRIMARY KEY,
    order_id     text        NOT NULL,
    amount_cents bigint      NOT NULL,
    job_id       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Optional (`totals: customer_totals` in the handler config): each customer's
-- invoiced sum. `version` is the optimistic-concurrency guard: a job updates
-- the row only if it still has the version the job read.
CREATE TABLE IF NOT EXISTS customer_totals (
    customer       text   PRIMARY KEY,
    invoiced_cents bigint NOT NULL DEFAULT 0,
    version        bigint NOT NULL DEFAULT 0
);
