-- 038: sekali.add_history() takes the current minute's rows in one fixed
-- order, the queues' names by byte, whatever order a host sends them in.
--
-- sql/037 upserted them in the order of the arrays, which is the order of
-- the queues in each host's configuration. Two janitors whose files list
-- the same queues in another order, adding to the same minute at once,
-- each took one row and waited for the other's: PostgreSQL broke the
-- deadlock after deadlock_timeout by failing one of them, whose counts
-- then went into a later minute. Taken in one order, the second waits for
-- the first row only, holding none, and goes on when the first commits.
-- An INSERT takes the rows of its SELECT in the order the SELECT yields
-- them; COLLATE "C" makes that order total (distinct names never tie, as
-- they may under a nondeterministic collation). Same signature, same sums.

CREATE OR REPLACE FUNCTION sekali.add_history(p_queues text[], p_completed bigint[],
                                              p_retried bigint[], p_dead bigint[],
                                              p_duplicates bigint[])
RETURNS void LANGUAGE sql AS $$
    INSERT INTO sekali.history AS h (queue, minute, completed, retried, dead_lettered,
                                     duplicates)
    SELECT q, date_trunc('minute', now()), c, r, d, u
      FROM unnest(p_queues, p_completed, p_retried, p_dead, p_duplicates) AS t(q, c, r, d, u)
     ORDER BY q COLLATE "C"
    ON CONFLICT (queue, minute) DO UPDATE
       SET completed = h.completed + excluded.completed,
           retried = h.retried + excluded.retried,
           dead_lettered = h.dead_lettered + excluded.dead_lettered,
           duplicates = h.duplicates + excluded.duplicates
$$;
