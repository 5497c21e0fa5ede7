/* check_batch_size.c - a worker's batch grows with PostgreSQL's round
 * trip, up to batch_max, and no further than a transaction could run
 * before it closed early (batch_size.c). The rule alone: that a far
 * server really grows a worker's batch and prefetch is check_distance's. */
/* links: core batch_size */
#include <stdint.h>

#include <check.h>

#include "batch_size.h"
#include "config.h"
#include "links.h"
#include "pipeline.h"
#include "store.h"
#include "suite.h"

/* sk_batch_size_update()'s servers, which this suite does not call. */
struct sk_store *sk_links_store(struct sk_links *l)
{
    (void)l;
    return NULL;
}
uint64_t sk_store_rtt_ns(const struct sk_store *s)
{
    (void)s;
    return 0;
}
uint64_t sk_links_redis_rtt_ns(const struct sk_links *l)
{
    (void)l;
    return 0;
}
int sk_links_prefetch(const struct sk_links *l)
{
    (void)l;
    return 0;
}
void sk_links_set_prefetch(struct sk_links *l, int prefetch)
{
    (void)l;
    (void)prefetch;
}

#define MS(x) ((uint64_t)((x) * 1e6))

static const struct sk_queue_conf queue = { .name = "q", .batch = 16, .batch_max = 256 };

/* The batch after SK_BATCH_KEEP batches at this round trip, each one's
 * batch checked to be the one before it until the last. */
static int settle(struct sk_batch_size *bs, uint64_t rtt_ns)
{
    int before = bs->now > 0 ? bs->now : queue.batch;
    for (int i = 1; i < SK_BATCH_KEEP; i++) {
        int got = sk_batch_size_next(bs, &queue, rtt_ns, 0);
        if (got != before)
            return got;
    }
    return sk_batch_size_next(bs, &queue, rtt_ns, 0);
}

/* Each doubling of the round trip past 1 ms doubles the batch, at once. */
START_TEST(test_the_batch_doubles_with_each_doubling_past_a_near_round_trip)
{
    static const struct { double rtt_ms; int batch; } want[] = {
        { 0.2, 16 }, { 1.0, 16 }, { 1.5, 32 }, { 2.0, 32 }, { 3.9, 64 }, { 7, 128 },
        { 40, 256 }, { 300, 256 },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(want); i++) {
        struct sk_batch_size bs = { 0 };
        int got = sk_batch_size_next(&bs, &queue, MS(want[i].rtt_ms), 0);
        ck_assert_msg(got == want[i].batch, "at a %.1f ms round trip: batch %d, want %d",
                      want[i].rtt_ms, got, want[i].batch);
    }
}
END_TEST

/* Until a round trip is measured (0) the batch stays as it is. */
START_TEST(test_no_measured_round_trip_keeps_the_batch)
{
    struct sk_batch_size bs = { 0 };
    for (int i = 0; i < 3 * SK_BATCH_KEEP; i++)
        ck_assert_int_eq(sk_batch_size_next(&bs, &queue, 0, 0), 16);
    ck_assert_int_eq(settle(&bs, MS(40)), 256);
    for (int i = 0; i < 3 * SK_BATCH_KEEP; i++)
        ck_assert_int_eq(sk_batch_size_next(&bs, &queue, 0, 0), 256);
}
END_TEST

/* A queue whose batch_max is its batch never grows; batch_max caps. */
START_TEST(test_batch_max_caps_the_growth)
{
    struct sk_queue_conf q = queue;
    q.batch_max = 48;
    struct sk_batch_size bs = { 0 };
    for (int i = 0; i < SK_BATCH_KEEP; i++)
        sk_batch_size_next(&bs, &q, MS(40), 0);
    ck_assert_int_eq(bs.now, 48);
    q.batch_max = 16;
    bs = (struct sk_batch_size){ 0 };
    for (int i = 0; i < SK_BATCH_KEEP; i++)
        ck_assert_int_eq(sk_batch_size_next(&bs, &q, MS(40), 0), 16);
}
END_TEST

/* Grown at 7 ms, the batch stays while the round trip is above half of
 * what it called for, and shrinks once below; never sooner than
 * SK_BATCH_KEEP batches after its last change, while it grows at once. */
START_TEST(test_a_batch_shrinks_only_well_below_its_round_trip_and_not_at_once)
{
    struct sk_batch_size bs = { 0 };
    ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(7), 0), 128);
    for (int i = 1; i < SK_BATCH_KEEP; i++)
        ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(0.3), 0), 128);
    ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(1.9), 0), 32);
    ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(40), 0), 256);
    ck_assert_int_eq(settle(&bs, MS(4.5)), 256);
    ck_assert_int_eq(settle(&bs, MS(3.5)), 64);
    ck_assert_int_eq(settle(&bs, MS(0.3)), 16);
}
END_TEST

/* A transaction that closed early after 20 handlers caps the batch there
 * at once, however far the server; SK_BATCH_RETRY_AFTER calm batches
 * later the cap doubles, and an early close lowers it again. */
START_TEST(test_an_early_close_caps_the_batch_until_calm_batches_pass)
{
    struct sk_batch_size bs = { 0 };
    ck_assert_int_eq(settle(&bs, MS(40)), 256);
    ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(40), 20), 20);
    for (int i = 1; i < SK_BATCH_RETRY_AFTER; i++)
        ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(40), 0), 20);
    ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(40), 0), 40);
    ck_assert_int_eq(sk_batch_size_next(&bs, &queue, MS(40), 3), 16);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_the_batch_doubles_with_each_doubling_past_a_near_round_trip,
        test_no_measured_round_trip_keeps_the_batch,
        test_batch_max_caps_the_growth,
        test_a_batch_shrinks_only_well_below_its_round_trip_and_not_at_once,
        test_an_early_close_caps_the_batch_until_calm_batches_pass,
        NULL,
    };
    return h_run_suite(h_suite("batch_size", 0, tests));
}
