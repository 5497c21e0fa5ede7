-- sekali: online
-- 036: a page of dead letters chosen among the index's entries alone,
-- whatever the selectors (issue 44).
--
-- A page is picked by id first, then read whole (ctl_dlq_read.c). With no
-- selector, or a whole group (reason and fingerprint, dead_letters_groups),
-- that walk stayed in an index; with a reason or a fingerprint alone it
-- followed the primary key and read every skipped letter's wide row:
-- `dlq list Q --reason failed --offset 100000` read 19,571 heap pages of
-- 500,000 letters (2.9 s) to show ten. Carrying reason and fingerprint in
-- the (queue, id) index lets an offset skip entries of the index only, for
-- any of these selectors (2,682 pages, 0.7 s). An offset still walks what
-- it skips; `--after ID` (keyset) costs what the first page costs.
--
-- dead_letters_page (sql/023), the same keys without the two columns,
-- stays: a walk with no selector reads it (1,919 buffers to skip 500,000
-- letters, against 4,468 in the wider one). A dead letter is written once
-- and rarely, so a second entry costs nothing on the per-job path.
-- Online (see sql/027): built concurrently while workers keep recording
-- letters.

CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_page_by
    ON sekali.dead_letters (queue, id) INCLUDE (reason, fingerprint);
