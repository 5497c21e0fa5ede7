-- sekali: online
-- 033: indexes that make the outbox's and the dedupe keys' retention cost
-- what is expired, never what is retained (issue 44).
--
-- sekali.purge_outbox() and purge_dedupe() (sql/012) picked their rows by
-- published_at, released_at and expires_at, none of them indexed: every
-- batch read the table until it had enough expired rows, and a round with
-- nothing expired read the whole table (a million published rows: 16,000
-- buffers a round). sql/034 makes them read these indexes in order.
--
-- The cost on the per-job path (docs/benchmark.md, "History at scale"):
-- the relay's mark-published update was not HOT already (published_at is
-- in outbox_due's predicate), and now adds one entry at the newest edge of
-- outbox_published; a dedupe key's release (its job finishing) was HOT and
-- now updates its three index entries, and an enqueue with a dedupe key
-- adds one. Keys without a dedupe key pay nothing.
--
-- Online (see sql/027): built concurrently while the relay and producers
-- keep writing.

-- Published rows, oldest first; unpublished rows are not retention's.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_published
    ON sekali.outbox (published_at) WHERE published_at IS NOT NULL;

-- A dedupe key stops protecting at the earlier of its release and its
-- expiry (least() skips a NULL released_at; expires_at is never NULL).
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_dedupe_done
    ON sekali.job_dedupe ((least(released_at, expires_at)));
