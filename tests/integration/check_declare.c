/* check_declare.c - queues declared by someone else: `declare: passive`
 * consumes them as they are, whatever their arguments or policies, and
 * `declare: auto` says what to do instead of retrying in silence; and the
 * delay queues of a quorum work queue, quorum too unless older ones are
 * classic; and a delay queue that nacks a retry's copy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "harness.h"

#define PASSIVE "    declare: passive\n" H_FAST_RETRIES

static amqp_table_entry_t text_arg(const char *key, const char *value)
{
    return (amqp_table_entry_t){ .key = amqp_cstring_bytes(key),
                                 .value = { .kind = AMQP_FIELD_KIND_UTF8,
                                            .value.bytes = amqp_cstring_bytes(value) } };
}

/* Declares the durable queue `name` as another tool would: with arguments
 * of its own (x-max-length, a dead-letter exchange that is not sekali's), or
 * none at all. */
static void declare_foreign(const char *name, bool with_arguments)
{
    amqp_table_entry_t args[2];
    args[0].key = amqp_cstring_bytes("x-max-length");
    args[0].value.kind = AMQP_FIELD_KIND_I64;
    args[0].value.value.i64 = 10000;
    args[1] = text_arg("x-dead-letter-exchange", "amq.fanout");
    h_declare_as_foreign(name, (amqp_table_t){ .num_entries = with_arguments ? 2 : 0, .entries = args });
}

static void rabbitmqctl(const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "\"$SEKALI_RABBITMQCTL\" %s >/dev/null 2>&1", args);
    int rc = system(cmd);
    ck_assert_msg(rc == 0, "rabbitmqctl %s: status 0x%x", args, rc);
}

/* One job of each outcome on a queue sekali did not declare: it runs once,
 * a retry goes through sekali's delay queue back to it, and a failure lands
 * in <queue>.dead, which sekali publishes to itself. */
static void run_each_outcome_once(struct h_run *r)
{
    h_run_start(r, &(struct h_run_opts){ .workers = 2, .queue_yaml = PASSIVE,
                                         .shape = &(struct sk_queue_shape){ .passive = true } });
    h_publish(r->b, r->queue, "test", "ok-1", "k-ok", NULL, "ok");
    h_publish(r->b, r->queue, "test", "retry-1", "k-retry", NULL, "retry");
    h_publish(r->b, r->queue, "test", "fail-1", "k-fail", NULL, "fail");
    H_WAIT(h_effects(r, "k-ok") == 1 && h_effects(r, "k-retry") == 1, 20000,
           "the ok and retried jobs should commit once each (ok %lld, retry %lld)",
           h_effects(r, "k-ok"), h_effects(r, "k-retry"));
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                       "'%s' AND idempotency_key = 'k-retry'", r->queue), 2);
    H_WAIT(h_queue_depth(r->b, r->dead) == 1, 20000, "the failed job should be in %s, has %u",
           r->dead, h_queue_depth(r->b, r->dead));
    h_expect_dead_reason(r, "failed");
    h_run_stop(r);
    ck_assert_int_eq(h_effects(r, "k-ok"), 1);
    ck_assert_int_eq(h_effects(r, "k-retry"), 1);
    ck_assert_int_eq(h_effects(r, "k-fail"), 0);
}

START_TEST(test_passive_queue_with_other_arguments_runs_retries_and_dead_letters)
{
    struct h_run r;
    h_run_open(&r, "passive");
    declare_foreign(r.queue, true);
    run_each_outcome_once(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_passive_queue_under_a_policy_runs_retries_and_dead_letters)
{
    struct h_run r;
    h_run_open(&r, "policy");
    char args[600];
    /* The policy's dead-letter exchange is not sekali's: sekali's own
     * copies to <queue>.dead must not depend on it. */
    snprintf(args, sizeof args, "set_policy --apply-to queues --priority 1 %s-p '^%s$' "
             "'{\"max-length\":10000,\"dead-letter-exchange\":\"amq.fanout\"}'", r.queue, r.queue);
    rabbitmqctl(args);
    declare_foreign(r.queue, false);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "\"$SEKALI_RABBITMQCTL\" list_queues -q name policy 2>/dev/null "
             "| grep -q '^%s[[:space:]]*%s-p$'", r.queue, r.queue);
    H_WAIT(system(cmd) == 0, 10000, "the policy should apply to %s", r.queue);
    run_each_outcome_once(&r);
    snprintf(args, sizeof args, "clear_policy %s-p", r.queue);
    rabbitmqctl(args);
    h_run_close(&r);
}
END_TEST

START_TEST(test_auto_declare_of_a_foreign_queue_says_to_set_passive_once)
{
    struct h_run r;
    h_run_open(&r, "auto");
    declare_foreign(r.queue, true);
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, NULL);
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_count_events(r.log, "worker", "outage_begin", "rabbitmq") >= 1, 20000,
           "sekalid should say it cannot consume the queue");
    /* A bounded window of the worker's backoff retries: still one line,
     * beside the start check's (doctor_failed, queue.arguments). */
    int64_t until = h_now_ms() + h_ms(3000);
    while (h_now_ms() < until)
        h_nap();
    ck_assert_int_eq(h_count_events(r.log, "worker", "outage_begin", "rabbitmq"), 1);
    ck_assert_int_eq(h_count_events(r.log, "worker", "doctor_failed", NULL), 1);
    ck_assert_int_ge(h_count_lines(r.log, "set declare: passive"), 1);
    ck_assert_int_ge(h_count_lines(r.log, "inequivalent arg"), 1);
    ck_assert_int_eq(h_consumers(r.b, r.queue), 0);
    h_stop_sekalid(r.sekalid, r.dir);
    h_run_close(&r);
}
END_TEST

START_TEST(test_passive_queue_that_does_not_exist_is_waited_for)
{
    struct h_run r;
    h_run_open(&r, "absent");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, PASSIVE);
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_count_events(r.log, "worker", "outage_begin", "rabbitmq") >= 1, 20000,
           "sekalid should say the passive queue does not exist");
    ck_assert_int_ge(h_count_lines(r.log, "does not exist"), 1);
    declare_foreign(r.queue, true);
    H_WAIT(h_consumers(r.b, r.queue) == 1, 30000, "the worker should consume once it exists");
    /* Said once by the worker, once by the start check (queue.exists). */
    ck_assert_int_eq(h_count_events(r.log, "worker", "outage_begin", "rabbitmq"), 1);
    ck_assert_int_eq(h_count_events(r.log, "worker", "doctor_failed", NULL), 1);
    h_stop_sekalid(r.sekalid, r.dir);
    h_run_close(&r);
}
END_TEST

/* How many of queue's delay queues the broker has of this type. */
static int delay_queues_of_type(const char *queue, const char *type)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd, "\"$SEKALI_RABBITMQCTL\" list_queues -q name type 2>/dev/null "
             "| awk -v p='%s.delay.' -v t='%s' 'index($1, p) == 1 && $2 == t { n++ } "
             "END { print n + 0 }'", queue, type);
    FILE *f = popen(cmd, "r");
    ck_assert_msg(f != NULL, "cannot run rabbitmqctl");
    int n = -1;
    ck_assert_int_eq(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

/* One retried job on a quorum work queue: it commits once, at attempt 2. */
static void retry_once_on_quorum(struct h_run *r)
{
    h_run_start(r, &(struct h_run_opts){ .workers = 1,
                                         .queue_yaml = "    queue_type: quorum\n" H_FAST_RETRIES,
                                         .shape = &(struct sk_queue_shape){ .quorum = true } });
    h_publish(r->b, r->queue, "test", "retry-1", "k-retry", NULL, "retry");
    H_WAIT(h_effects(r, "k-retry") == 1, 20000, "the retried job should commit once, has %lld",
           h_effects(r, "k-retry"));
    h_run_stop(r);
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                       "'%s' AND idempotency_key = 'k-retry'", r->queue), 2);
}

/* A classic delay queue lives on the node that declared it: while that node
 * is down, every retry through it would be refused and handed back, each
 * time counted against the work queue's delivery_limit. */
START_TEST(test_a_quorum_queue_retries_through_quorum_delay_queues)
{
    struct h_run r;
    h_run_open(&r, "qdelay");
    retry_once_on_quorum(&r);
    ck_assert_int_ge(delay_queues_of_type(r.queue, "quorum"), 1);
    ck_assert_int_eq(delay_queues_of_type(r.queue, "classic"), 0);
    h_run_close(&r);
}
END_TEST

/* Delay queues made before they followed their work queue's type cannot be
 * declared as quorum queues: the broker refuses another type for a queue
 * that exists. */
START_TEST(test_an_older_classic_delay_queue_of_a_quorum_queue_is_used_as_it_is)
{
    struct h_run r;
    h_run_open(&r, "qdelayold");
    /* The first retry's delay (initial: 10ms) is always the 10 ms bucket. */
    char name[600];
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_declare_delay(r.b, r.queue, false, 10, name, sizeof name, &err) ==
                  SK_OK, "declaring the classic delay queue: %s", err.msg);
    retry_once_on_quorum(&r);
    ck_assert_int_eq(delay_queues_of_type(r.queue, "classic"), 1);
    ck_assert_int_eq(delay_queues_of_type(r.queue, "quorum"), 0);
    h_run_close(&r);
}
END_TEST

/* A quorum work queue that an older sekali created on RabbitMQ 4, without
 * x-delivery-limit (sekali now declares -1 there, which the broker refuses
 * for a queue made without it): it is consumed as it is, under the
 * broker's default limit, and each declarer says so once. On 3.x sekali
 * never adds the argument, and nothing is said. */
START_TEST(test_a_quorum_queue_made_without_a_delivery_limit_is_used_as_it_is)
{
    struct h_run r;
    h_run_open(&r, "qnolimit");
    char dead[600];
    snprintf(dead, sizeof dead, "%s.dead", r.queue);
    amqp_table_entry_t args[] = {
        text_arg("x-dead-letter-exchange", ""), text_arg("x-dead-letter-routing-key", dead),
        text_arg("x-queue-type", "quorum"), text_arg("x-dead-letter-strategy", "at-least-once"),
        text_arg("x-overflow", "reject-publish"),
    };
    h_declare_as_foreign(r.queue, (amqp_table_t){ .num_entries = 5, .entries = args });
    retry_once_on_quorum(&r);
    const char *v = getenv("SEKALI_RABBITMQ");
    bool four = v != NULL && atoi(v) >= 4;
    int said = h_count_lines(r.log, "has no x-delivery-limit: RabbitMQ's default limit");
    ck_assert_msg(four ? said >= 1 : said == 0, "said %d times (RabbitMQ %s)", said,
                  v != NULL ? v : "3");
    h_run_close(&r);
}
END_TEST

/* A nacked copy is the queue's state, not the message's: a quorum queue
 * electing its leader nacks, as a full queue under reject-publish does
 * (here a policy makes the delay queues so). The job goes back to its
 * queue, runs again, and its retry goes through once the queue takes it:
 * never dead-lettered as a message that cannot be re-scheduled. */
START_TEST(test_a_nacked_retry_copy_hands_the_job_back)
{
    struct h_run r;
    h_run_open(&r, "nacked");
    char args[600];
    snprintf(args, sizeof args, "set_policy --apply-to queues --priority 1 %s-full "
             "'^%s\\.delay\\.' '{\"max-length\":0,\"overflow\":\"reject-publish\"}'",
             r.queue, r.queue);
    rabbitmqctl(args);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES });
    h_publish(r.b, r.queue, "test", "retry-1", "k-retry", NULL, "retry");
    /* Once: the broker has been seen to take the next copy while the
     * policy holds (RabbitMQ 3.10), so the job may run before it is
     * cleared. */
    H_WAIT(h_count_outcomes(r.log, "handed_back", "reschedule_failed") >= 1, 20000,
           "the retry's copy should be nacked and the job handed back");
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    snprintf(args, sizeof args, "clear_policy %s-full", r.queue);
    rabbitmqctl(args);
    H_WAIT(h_effects(&r, "k-retry") == 1, 20000, "the job should run once the copy is taken");
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-retry"), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    ck_assert_int_eq(h_count_outcomes(r.log, "dead", NULL), 0);
    /* A nack is the queue's answer on a sound connection: kept, not
     * reopened for every hand-back. */
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_PUBLISH_FAILED, NULL), 0);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_passive_queue_with_other_arguments_runs_retries_and_dead_letters,
        test_passive_queue_under_a_policy_runs_retries_and_dead_letters,
        test_auto_declare_of_a_foreign_queue_says_to_set_passive_once,
        test_passive_queue_that_does_not_exist_is_waited_for,
        test_a_quorum_queue_retries_through_quorum_delay_queues,
        test_an_older_classic_delay_queue_of_a_quorum_queue_is_used_as_it_is,
        test_a_quorum_queue_made_without_a_delivery_limit_is_used_as_it_is,
        test_a_nacked_retry_copy_hands_the_job_back,
        NULL,
    };
    return h_run_suite(h_suite("declare", 180, tests));
}
