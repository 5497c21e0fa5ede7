-- 003: replies. A job published with reply_to gets its result sent there,
-- once per key: replied_at is set after the broker confirmed the reply, so a
-- redelivery of a job whose worker died between COMMIT and the reply sends
-- the saved result, and later copies send nothing.
ALTER TABLE sekali.idempotency_keys ADD COLUMN IF NOT EXISTS replied_at timestamptz;
