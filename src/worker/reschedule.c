/* reschedule.c - retry copies through delay queues, and dead letters with
 * their reasons (see reschedule.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "reschedule.h"
#include "text.h"

#define LADDER_START_MS 10

static void now_iso8601(char *out, size_t size);

uint32_t sk_reschedule_bucket(uint32_t delay_ms)
{
    uint64_t step = LADDER_START_MS;
    while (step < delay_ms)
        step = step * 5 / 4 + 1;
    return step > UINT32_MAX ? UINT32_MAX : (uint32_t)step;
}

uint32_t sk_reschedule_retry_delay(const struct sk_retry_conf *retry, uint32_t next_attempt)
{
    uint64_t ceiling = retry->initial_ms;
    for (uint32_t i = 2; i < next_attempt && ceiling < retry->max_ms; i++)
        ceiling *= 2;
    if (ceiling > retry->max_ms)
        ceiling = retry->max_ms;
    return sk_reschedule_bucket(sk_jitter(0, (uint32_t)ceiling));
}

int sk_reschedule_later(struct sk_broker *pub, const struct sk_queue_conf *queue,
                        const amqp_envelope_t *env,
                        const struct sk_envelope *parsed, uint32_t delay_ms,
                        uint32_t next_attempt, const char *error, struct sk_err *err)
{
    char delay_queue[600], now[64];
    /* A delay queue that cannot be declared is the broker's or the
     * configuration's problem, never this message's: SK_AGAIN, so that the
     * caller hands the message back rather than dead-letter it. */
    bool quorum = queue->queue_type == SK_QUEUE_QUORUM;
    if (sk_broker_declare_delay(pub, queue->name, quorum, delay_ms, delay_queue,
                                sizeof(delay_queue), err) != SK_OK)
        return err != NULL ? (err->code = SK_AGAIN) : SK_AGAIN;
    now_iso8601(now, sizeof(now));
    struct sk_header headers[3] = {
        { .key = "x-sekali-attempt", .number = next_attempt },
    };
    size_t n = 1;
    char text[SK_TEXT_ERROR_MAX];
    if (error != NULL) {
        sk_text_copy(text, sizeof(text), error);
        headers[n++] = (struct sk_header){ .key = "x-sekali-last-error", .text = text };
        headers[n++] = (struct sk_header){
            .key = "x-sekali-first-failure",
            .text = parsed->first_failure[0] != '\0' ? parsed->first_failure : now };
    }
    return sk_broker_republish(pub, delay_queue, env, headers, n, err);
}

int sk_reschedule_dead(struct sk_broker *pub, const char *queue, const amqp_envelope_t *env,
                       const struct sk_envelope *parsed, const char *reason, const char *error,
                       struct sk_err *err)
{
    char dead[600], now[64];
    int rc = sk_broker_dead_name(queue, dead, sizeof(dead), err);
    if (rc != SK_OK)
        return rc;
    now_iso8601(now, sizeof(now));
    const char *first = parsed != NULL && parsed->first_failure[0] != '\0'
        ? parsed->first_failure : now;
    char why[SK_TEXT_ERROR_MAX], text[SK_TEXT_ERROR_MAX];
    sk_text_copy(why, sizeof(why), reason);
    sk_text_copy(text, sizeof(text), error);
    struct sk_header headers[] = {
        { .key = "x-sekali-reason", .text = why },
        { .key = "x-sekali-error", .text = text },
        { .key = "x-sekali-attempts", .number = parsed != NULL ? parsed->delivery_attempt : 1 },
        { .key = "x-sekali-queue", .text = queue },
        { .key = "x-sekali-first-failure", .text = first },
        { .key = "x-sekali-last-failure", .text = now },
    };
    /* Fitted: a dead letter is kept whatever it carries, so a producer's
     * bulky headers give way to the reason (see sk_broker_republish_fitted()). */
    return sk_broker_republish_fitted(pub, dead, env, headers, SK_ARRAY_LEN(headers), err);
}

static void now_iso8601(char *out, size_t size)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    struct tm tm;
    gmtime_r(&t.tv_sec, &tm);
    strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}
