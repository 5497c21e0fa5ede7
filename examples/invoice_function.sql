-- The invoice example as a PL/pgSQL function, for the stock SQL handler
-- (`make demo HANDLER=sql`; docs/handlers.md): the same row as
-- examples/invoice.c writes, with no C. Run after examples/invoice.sql.
--
--   handler: sql
--   config:
--     statement: "SELECT create_invoice(:body::jsonb, :job_id)"
CREATE OR REPLACE FUNCTION create_invoice(o jsonb, job_id text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    id bigint;
BEGIN
    IF o->>'order_id' IS NULL OR (o->>'amount_cents') IS NULL THEN
        -- Will never work with this body: dead-letter it now.
        RAISE EXCEPTION 'an invoice needs order_id and amount_cents' USING ERRCODE = 'SKFAL';
    END IF;
    INSERT INTO invoices (order_id, amount_cents, job_id)
    VALUES (o->>'order_id', (o->>'amount_cents')::bigint, create_invoice.job_id)
    RETURNING invoices.id INTO id;
    RETURN 'invoice ' || id;
END $$;
