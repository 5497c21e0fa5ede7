-- sekali: online
-- 030: the first counts of sql/029, and the indexes sekali.dlq_groups()
-- reads a group's first and last failure from (issue 44).
--
-- Online (see sql/027): the indexes are built concurrently, and each
-- recount is one statement that reads every failed key, or every dead
-- letter, in one snapshot without locking either table (a few seconds at
-- 10 M keys or a million letters); the readers switch to the counts when
-- it has committed. A run cut short runs again from the top: a recount
-- taken twice gives the same sums.

-- A group's first failure, and its last with the key of that letter.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_group_first
    ON sekali.dead_letters (queue, reason, fingerprint, (coalesce(first_failure, failed_at)));
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_group_last
    ON sekali.dead_letters (queue, reason, fingerprint, failed_at) INCLUDE (key);

SELECT sekali.recount_failed_keys();
SELECT sekali.recount_dead_letters();
