-- 005: the outbox's indexes follow what reads them.
--
-- A row the broker refused keeps publish_error and stays unpublished until
-- an operator looks, so in 004's index every claim (which skips such rows)
-- had to read past all of them: about 0.3 ms per claim per 2,000 refused
-- rows, growing without bound. The relay's work list now leaves them out,
-- and a small index of their own serves the metrics' count of failed rows.
DROP INDEX IF EXISTS sekali.outbox_due;
CREATE INDEX IF NOT EXISTS outbox_due ON sekali.outbox (run_at, id)
    WHERE published_at IS NULL AND publish_error IS NULL;
CREATE INDEX IF NOT EXISTS outbox_failed ON sekali.outbox (queue)
    WHERE published_at IS NULL AND publish_error IS NOT NULL;
