/* doctor_broker.c - doctor's checks (doctor.h) of each configured queue:
 * that it exists with the arguments sekali needs (dead letters to
 * <queue>.dead, a quorum queue's at-least-once dead-lettering and delivery
 * limit), its dead-letter queue, and the time a delivery may stay unacked
 * (the broker's consumer_timeout) against job_timeout, the observed job
 * duration and the prefetch window, the lock TTL against the observed
 * duration, and the retention against the longest a job's redeliveries can
 * take.
 *
 * AMQP tells a client neither a queue's arguments nor the broker's
 * consumer_timeout. The arguments are read by declaring the queue with
 * sekali's own (the broker refuses a declaration that differs, naming the
 * argument); policies are invisible this way, so for a queue declared by
 * someone else a difference only warns. consumer_timeout is what
 * amqp.consumer_timeout (or sekalictl doctor --consumer-timeout) says. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "config_value.h"
#include "doctor.h"
#include "lane.h"

/* The broker's default consumer_timeout (RabbitMQ 3.8.15 and later). */
#define BROKER_DEFAULT_CONSUMER_TIMEOUT_MS (30u * 60 * 1000)

static void check_queue(struct sk_doctor *d, struct sk_broker *b, const struct sk_queue_conf *q);
static void check_stranded_lanes(struct sk_doctor *d, struct sk_broker *b,
                                 const struct sk_queue_conf *q);
static void check_limits(struct sk_doctor *d, const struct sk_queue_conf *q, int major);
static void check_priorities(struct sk_doctor *d, const struct sk_queue_conf *q,
                             const struct sk_broker *b);
static void check_timeouts(struct sk_doctor *d, const struct sk_queue_conf *q);
static void check_redelivery(struct sk_doctor *d, const struct sk_queue_conf *q);
static void check_handler(struct sk_doctor *d, const struct sk_queue_conf *q);
static bool observed_p99(const char *metrics, const char *queue, double *p99_s, double *top_s,
                         long *count);

void sk_doctor_broker(struct sk_doctor *d)
{
    struct sk_broker *b = NULL;
    struct sk_err err = { 0 };
    if (sk_broker_open(&b, &d->conf->amqp, &err) != SK_OK) {
        sk_doctor_add(d, "broker.reachable", "", SK_DOCTOR_FAIL,
                      "make the amqp section reach the broker sekalid consumes", "%s", err.msg);
        return;
    }
    if (!d->cheap)
        sk_doctor_rabbitmq_version(d, sk_broker_version(b));
    for (size_t i = 0; i < d->conf->n_queues; i++) {
        check_queue(d, b, &d->conf->queues[i]);
        if (!d->cheap)
            check_stranded_lanes(d, b, &d->conf->queues[i]);
        check_limits(d, &d->conf->queues[i], sk_broker_major(b));
        check_priorities(d, &d->conf->queues[i], b);
        check_timeouts(d, &d->conf->queues[i]);
        check_redelivery(d, &d->conf->queues[i]);
        check_handler(d, &d->conf->queues[i]);
    }
    sk_broker_close(b);
}

static void check_queue(struct sk_doctor *d, struct sk_broker *b, const struct sk_queue_conf *q)
{
    struct sk_err err = { 0 };
    bool exists, dead_exists;
    uint32_t messages, consumers;
    char dead[600];
    sk_broker_dead_name(q->name, dead, sizeof(dead), NULL);  /* names fit: config caps them */
    if (sk_broker_queue_probe(b, q->name, &exists, &messages, &consumers, &err) != SK_OK ||
        sk_broker_queue_probe(b, dead, &dead_exists, &messages, &consumers, &err) != SK_OK) {
        sk_doctor_add(d, "queue.exists", q->name, SK_DOCTOR_FAIL, NULL, "%s", err.msg);
        return;
    }
    bool passive = q->declare == SK_DECLARE_PASSIVE;
    bool quorum = q->queue_type == SK_QUEUE_QUORUM;
    if (!exists) {
        sk_doctor_add(d, "queue.exists", q->name, passive ? SK_DOCTOR_FAIL : SK_DOCTOR_WARN,
                      passive ? "declare it (declare: passive: sekalid will not)"
                              : "start sekalid, which declares it",
                      "the queue does not exist");
    } else {
        struct sk_queue_shape shape = sk_conf_queue_shape(q);
        shape.passive = false;
        bool conforms;
        char why[512] = "";
        if (sk_broker_queue_conforms(b, q->name, &shape, &conforms, why, sizeof(why), &err) !=
            SK_OK)
            sk_doctor_add(d, "queue.arguments", q->name, SK_DOCTOR_FAIL, NULL, "%s", err.msg);
        else if (conforms)
            sk_doctor_add(d, "queue.arguments", q->name, SK_DOCTOR_PASS, NULL,
                          "%s, dead letters to %s%s", quorum ? "quorum" : "classic", dead,
                          quorum ? " at least once" : "");
        else
            sk_doctor_add(d, "queue.arguments", q->name, passive ? SK_DOCTOR_WARN : SK_DOCTOR_FAIL,
                          passive ? "make sure a policy gives it dead-letter-exchange \"\" and "
                                    "dead-letter-routing-key <queue>.dead"
                                  : "drain and delete the queue, and let sekalid declare it "
                                    "(or set declare: passive and give it a policy)",
                          "its arguments are not those sekali gives a %s queue (%s)%s: dead "
                          "letters may not reach %s, or the broker may redeliver without end",
                          quorum ? "quorum" : "classic", why,
                          passive ? "; a policy, invisible over AMQP, may make up for it" : "",
                          dead);
    }
    sk_doctor_add(d, "queue.dead_queue", q->name, dead_exists ? SK_DOCTOR_PASS : SK_DOCTOR_WARN,
                  "start sekalid, which declares it",
                  dead_exists ? "%s exists" : "%s does not exist: dead letters have nowhere to go",
                  dead);
    if (quorum && q->delivery_limit > 0)
        sk_doctor_add(d, "queue.delivery_limit", q->name, SK_DOCTOR_PASS, NULL,
                      "%d deliveries, then dead-lettered", q->delivery_limit);
    else if (quorum)
        sk_doctor_add(d, "queue.delivery_limit", q->name, SK_DOCTOR_FAIL,
                      "set the queue's delivery_limit (e.g. 20; above retry.max_attempts)",
                      "none: a message that kills its worker every time is redelivered for "
                      "ever");
}

/* Lanes past the queue's `lanes` (it was lowered, or set to 0) that still
 * hold jobs: no worker consumes them, so those jobs would wait for ever.
 * Up to SK_LANES_MAX passive declares, each a missing queue's channel
 * reopened: not in the cheap subset. */
static void check_stranded_lanes(struct sk_doctor *d, struct sk_broker *b,
                                 const struct sk_queue_conf *q)
{
    for (unsigned i = (unsigned)q->lanes; i < SK_LANES_MAX; i++) {
        char lane[512];
        bool exists;
        uint32_t messages = 0, consumers = 0;
        struct sk_err err = { 0 };
        if (sk_lane_name(q->name, i, lane, sizeof(lane)) != 0)
            return;
        if (sk_broker_queue_probe(b, lane, &exists, &messages, &consumers, &err) != SK_OK) {
            sk_doctor_add(d, "queue.stranded_lanes", q->name, SK_DOCTOR_FAIL, NULL, "%s",
                          err.msg);
            return;
        }
        if (exists && messages > 0)
            sk_doctor_add(d, "queue.stranded_lanes", q->name, SK_DOCTOR_WARN,
                          "set lanes back above the lane until it is empty, or move its "
                          "messages to the queue itself (its intake forwards them)",
                          "%s holds %" PRIu32 " messages that no worker takes (lanes is %d)",
                          lane, messages, q->lanes);
    }
}

/* Under RabbitMQ 4: a classic work queue is one node's copy (Amazon MQ
 * calls classic queues "not guaranteed to be durable in all cases"), and
 * a quorum queue's delivery limit must not cut sekali's own accounting
 * short: crashes (max_crashes) count as deliveries, and so may retries an
 * operator's policy sends back through the queue. */
static void check_limits(struct sk_doctor *d, const struct sk_queue_conf *q, int major)
{
    bool quorum = q->queue_type == SK_QUEUE_QUORUM;
    if (!quorum && major >= 4)
        sk_doctor_add(d, "queue.type", q->name, SK_DOCTOR_WARN,
                      "use queue_type: quorum (a new queue name, or drain and delete it)",
                      "a classic work queue under RabbitMQ %d: not replicated, its jobs live "
                      "on one node", major);
    int limit = (int)q->delivery_limit;
    if (quorum && limit > 0 && (limit <= q->max_crashes || limit < q->retry.max_attempts))
        sk_doctor_add(d, "queue.delivery_limit_low", q->name, SK_DOCTOR_WARN,
                      "raise delivery_limit above max_crashes and retry.max_attempts",
                      "delivery_limit %d is not above sekali's own attempts (max_crashes %d, "
                      "retry.max_attempts %d): the broker dead-letters a job before sekali "
                      "would", limit, q->max_crashes, q->retry.max_attempts);
}

/* A quorum queue's max_priority is a config sekalid accepts (RabbitMQ 4.3
 * takes it) and a broker before 4.3 refuses at every worker's declaration:
 * said here before a start that would not consume. */
static void check_priorities(struct sk_doctor *d, const struct sk_queue_conf *q,
                             const struct sk_broker *b)
{
    if (q->queue_type != SK_QUEUE_QUORUM || q->max_priority == 0)
        return;
    if (sk_broker_quorum_priorities(b))
        sk_doctor_add(d, "queue.priorities", q->name, SK_DOCTOR_PASS, NULL,
                      "strict priorities 0-%d on a quorum queue (RabbitMQ %s)", q->max_priority,
                      sk_broker_version(b));
    else
        sk_doctor_add(d, "queue.priorities", q->name, SK_DOCTOR_FAIL,
                      "use queue_type: classic, or drop max_priority, or upgrade to 4.3",
                      "max_priority on a quorum queue needs RabbitMQ 4.3 or later; this broker "
                      "is %s and refuses it: no worker will consume", sk_broker_version(b));
}

/* A delivery stays unacked for its job's run, and the acks of a window are
 * sent together (up to prefetch jobs later): past consumer_timeout the
 * broker closes the channel and redelivers everything unacked. The lock
 * must outlive a run's renewal gaps; p99 near the TTL means one slow
 * renewal loses it. */
static void check_timeouts(struct sk_doctor *d, const struct sk_queue_conf *q)
{
    uint32_t ct = d->consumer_timeout_ms;
    char ct_text[32], jt_text[32];
    sk_conf_value_fmt_duration(ct > 0 ? ct : BROKER_DEFAULT_CONSUMER_TIMEOUT_MS, ct_text,
                               sizeof(ct_text));
    sk_conf_value_fmt_duration(q->job_timeout_ms, jt_text, sizeof(jt_text));
    const char *told = ct > 0 ? "" : " (the broker's default; set amqp.consumer_timeout to "
                                     "say what yours is)";
    if (ct == 0)
        ct = BROKER_DEFAULT_CONSUMER_TIMEOUT_MS;
    if (q->job_timeout_ms == 0)
        sk_doctor_add(d, "queue.consumer_timeout", q->name, SK_DOCTOR_WARN,
                      "set the queue's job_timeout below the broker's consumer_timeout",
                      "no job_timeout: a handler that hangs past consumer_timeout %s%s makes "
                      "the broker close the channel and redeliver the window", ct_text, told);
    else if (q->job_timeout_ms >= ct)
        sk_doctor_add(d, "queue.consumer_timeout", q->name, SK_DOCTOR_FAIL,
                      "raise consumer_timeout (rabbitmq.conf, or the queue's x-consumer-timeout) "
                      "above job_timeout, or lower job_timeout",
                      "job_timeout %s is not below consumer_timeout %s%s: a long job's channel "
                      "is closed and its window redelivered while it runs", jt_text, ct_text,
                      told);
    else
        sk_doctor_add(d, "queue.consumer_timeout", q->name, SK_DOCTOR_PASS, NULL,
                      "job_timeout %s below consumer_timeout %s%s", jt_text, ct_text, told);

    if (d->cheap)
        return;  /* the observed durations are sekalid's own /metrics */
    double p99, top;
    long count;
    if (!observed_p99(d->metrics, q->name, &p99, &top, &count)) {
        sk_doctor_add(d, "queue.observed_duration", q->name, SK_DOCTOR_SKIP, NULL,
                      "no job durations to judge (sekalid's /metrics not reachable, or no job "
                      "completed yet)");
        return;
    }
    double window_s = p99 * q->prefetch;
    bool over_ct = window_s * 1000 >= ct;
    bool near_ttl = q->lock && p99 * 1000 >= q->lock_ttl_ms / 2.0;
    char ttl_text[32];
    sk_conf_value_fmt_duration(q->lock_ttl_ms, ttl_text, sizeof(ttl_text));
    sk_doctor_add(d, "queue.observed_duration", q->name,
                  over_ct || near_ttl ? SK_DOCTOR_WARN : SK_DOCTOR_PASS,
                  over_ct ? "lower the queue's prefetch, or raise consumer_timeout"
                          : "raise the queue's lock_ttl well above the p99",
                  "p99 %s %.3gs over %ld jobs; x prefetch %d = %.3gs against consumer_timeout "
                  "%s%s%s", isinf(p99) ? "above" : "at most", isinf(p99) ? top : p99, count,
                  q->prefetch, isinf(window_s) ? top * q->prefetch : window_s, ct_text,
                  !q->lock ? "" : near_ttl ? "; at least half the lock_ttl " : "; below half "
                                                                               "the lock_ttl ",
                  q->lock ? ttl_text : "");
}

/* The longest a job's deliveries can spread over by the settings: each of
 * its deliveries (max_attempts, plus the max_crashes deliveries a worker
 * dying under it may take (job.c claims that many more), or the quorum
 * delivery_limit if larger: crashes count there too) held until job_timeout (else the broker's
 * consumer_timeout) ends it, and the retry delays' ceilings between them.
 * A copy arriving after the retention finds its key maybe purged; the
 * worker quarantines it (beyond_retention) rather than run it twice, so a
 * retention shorter than this path turns the late retries of a legitimate
 * job into dead letters. Lock-busy reschedules are not bounded here. */
static void check_redelivery(struct sk_doctor *d, const struct sk_queue_conf *q)
{
    if (q->retention_ms == SK_RETENTION_FOREVER) {
        sk_doctor_add(d, "retention.redelivery", q->name, SK_DOCTOR_PASS, NULL,
                      "keys are kept forever");
        return;
    }
    uint64_t ct = d->consumer_timeout_ms > 0 ? d->consumer_timeout_ms
                                             : BROKER_DEFAULT_CONSUMER_TIMEOUT_MS;
    uint64_t hold = q->job_timeout_ms > 0 && q->job_timeout_ms < ct ? q->job_timeout_ms : ct;
    int own = q->retry.max_attempts + q->max_crashes;
    int deliveries = own > q->delivery_limit ? own : q->delivery_limit;
    uint64_t path = hold * (uint64_t)(deliveries > 0 ? deliveries : 1), delay = q->retry.initial_ms;
    for (int k = 1; k < q->retry.max_attempts; k++) {
        path += delay < q->retry.max_ms ? delay : q->retry.max_ms;
        if (delay < q->retry.max_ms)
            delay *= 2;
    }
    char keep[32], longest[32];
    sk_conf_value_fmt_duration(q->retention_ms, keep, sizeof(keep));
    sk_conf_value_fmt_duration(path, longest, sizeof(longest));
    bool short_keep = q->retention_ms < path;
    sk_doctor_add(d, "retention.redelivery", q->name, short_keep ? SK_DOCTOR_WARN : SK_DOCTOR_PASS,
                  "raise the queue's retention above the longest redelivery path, or lower "
                  "job_timeout, retry.max_attempts, max_crashes or retry.max",
                  "%d deliveries held up to %s each, with their retry delays, can spread over "
                  "%s; keys are kept %s%s", deliveries > 0 ? deliveries : 1,
                  q->job_timeout_ms > 0 && q->job_timeout_ms < ct ? "job_timeout" : "consumer_timeout",
                  longest, keep,
                  short_keep ? ": a late redelivery is quarantined (beyond_retention) instead "
                               "of run" : "");
}

/* The 99th percentile of queue's job durations from sekalid's histogram
 * (all job types together): the upper bound of the first bucket holding
 * it, INFINITY past the last finite one, which is *top_s. false when there
 * is nothing to judge. */
static bool observed_p99(const char *metrics, const char *queue, double *p99_s, double *top_s,
                         long *count)
{
    if (metrics == NULL)
        return false;
    enum { MAX_BUCKETS = 64 };
    double le[MAX_BUCKETS];
    double n[MAX_BUCKETS];
    int buckets = 0;
    char want[600];
    snprintf(want, sizeof(want), "sekali_job_duration_seconds_bucket{queue=\"%s\",", queue);
    size_t want_len = strlen(want);
    for (const char *line = metrics; line != NULL && *line != '\0';) {
        const char *end = strchr(line, '\n');
        if (strncmp(line, want, want_len) == 0) {
            const char *l = strstr(line, "le=\"");
            const char *v = strstr(line, "} ");
            if (l != NULL && v != NULL && (end == NULL || v < end)) {
                double bound = strncmp(l + 4, "+Inf", 4) == 0 ? INFINITY : atof(l + 4);
                int b = 0;
                while (b < buckets && le[b] != bound)
                    b++;
                if (b == buckets && buckets < MAX_BUCKETS) {
                    le[buckets] = bound;
                    n[buckets++] = 0;
                }
                if (b < buckets)
                    n[b] += atof(v + 2);
            }
        }
        line = end != NULL ? end + 1 : NULL;
    }
    double total = 0;
    *top_s = 0;
    for (int b = 0; b < buckets; b++) {
        if (isinf(le[b]))
            total = n[b];
        else if (le[b] > *top_s)
            *top_s = le[b];
    }
    if (total <= 0)
        return false;
    *count = (long)total;
    *p99_s = INFINITY;
    for (int b = 0; b < buckets; b++)
        if (n[b] >= 0.99 * total && le[b] < *p99_s)
            *p99_s = le[b];
    return true;
}

/* A worker whose handler cannot run (its ready() refused: the stock SQL
 * handler's statement does not prepare) consumes nothing: the queue
 * stalls while the servers look healthy. sekalid's /metrics counts them;
 * the why is in /readyz, `sekalictl status` and the log. */
static void check_handler(struct sk_doctor *d, const struct sk_queue_conf *q)
{
    if (d->cheap || d->metrics == NULL)
        return;
    char want[600];
    int n = snprintf(want, sizeof(want), "sekali_workers_blocked{queue=\"%s\"} ", q->name);
    const char *at = d->metrics;
    while ((at = strstr(at, want)) != NULL && at != d->metrics && at[-1] != '\n')
        at++;
    double blocked = at != NULL ? atof(at + n) : 0;
    if (blocked > 0)
        sk_doctor_add(d, "queue.handler", q->name, SK_DOCTOR_FAIL,
                      "make the handler's configuration work against the database (`sekalictl "
                      "status` says why; e.g. create the function its statement calls): the "
                      "workers retry by themselves",
                      "%.0f of %d workers cannot run the handler and hold no job: the queue "
                      "does not move", blocked, q->workers);
    else if (at != NULL)
        sk_doctor_add(d, "queue.handler", q->name, SK_DOCTOR_PASS, NULL,
                      "every running worker can run the handler");
}
