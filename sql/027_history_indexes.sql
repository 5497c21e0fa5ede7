-- sekali: online
-- 027: indexes that make retention and the operator's reads cost what is
-- expired or in flight, never what is retained (issue 44).
--
-- Before them the table had only its primary key (queue, key): the janitor
-- found expired keys by reading the queue's keys until it had a batch (once
-- they were gone, every round read the whole queue), and status counted
-- every retained key to find the few in `processing`.
--
-- Both are partial. The per-job statements (sql/016, 017) insert a key
-- already `completed`: the first index takes one entry at the table's
-- newest edge (updated_at grows with time), the second none. External mode
-- (claim, then complete) and duplicates (updated_at moves) now update a
-- row non-HOT; docs/benchmark.md has what that costs.
--
-- Online: sekalictl migrate runs each statement of a file marked as above
-- on its own, outside a transaction (CREATE INDEX CONCURRENTLY cannot run
-- in one), so workers keep writing the table while the indexes are built.
-- It first drops the invalid index an interrupted build leaves behind,
-- which IF NOT EXISTS would otherwise take for done.

-- The janitor's sekali.purge_keys(): the finished keys of a queue, oldest
-- first.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_expiry
    ON sekali.idempotency_keys (queue, updated_at)
    WHERE status IN ('completed', 'failed', 'cancelled');

-- sekali.queue_status() and sekalictl verify: the keys in hand, and those
-- given up.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_unfinished
    ON sekali.idempotency_keys (queue, status, created_at)
    WHERE status IN ('processing', 'failed');
