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
