/* check_outbox.c - the producer side: sekali.enqueue() inside the caller's
 * transaction, unique dedupe keys, scheduled jobs, and an outbox relay that
 * dies between a publish and its mark. sekalid runs with one relay. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define RELAYS "outbox:\n  relays: 2\n  poll_interval: 200ms\n"

START_TEST(test_enqueue_in_a_rolled_back_transaction_publishes_nothing)
{
    struct h_run r;
    h_run_open(&r, "rollback");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .top_yaml = H_RELAY });
    h_pg_exec(r.pg, "BEGIN");
    h_enqueue(r.pg, r.queue, "k-rolled-back", NULL, NULL);
    h_pg_exec(r.pg, "ROLLBACK");
    h_pg_exec(r.pg, "BEGIN");
    h_enqueue(r.pg, r.queue, "k-committed", NULL, NULL);
    h_pg_exec(r.pg, "COMMIT");
    H_WAIT(h_effects(&r, "k-committed") == 1, 20000, "the committed job should run");
    /* The relay publishes in order: the rolled-back job never existed. */
    ck_assert_int_eq(h_effects(&r, "k-rolled-back"), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 1);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

struct producer {
    const char        *queue;
    const char        *dedupe_key;
    pthread_barrier_t *barrier;
    char               id[128];
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    PGconn *pg = h_pg();
    h_pg_exec(pg, "BEGIN");
    pthread_barrier_wait(p->barrier);
    snprintf(p->id, sizeof(p->id), "%s", h_enqueue(pg, p->queue, NULL, p->dedupe_key, NULL));
    h_pg_exec(pg, "COMMIT");
    PQfinish(pg);
    return NULL;
}

START_TEST(test_one_dedupe_key_from_eight_connections_gives_one_job)
{
    struct h_run r;
    h_run_open(&r, "dedupe");
    /* sekalid starts after the race: a producer that a busy machine keeps
     * waiting until the first job already ran and freed the key would, as
     * it should, get a new job, and that is not the race under test. */
    /* Of this run alone: the test database outlives runs, and a key some
     * interrupted run left held would hand out that run's job. */
    char dedupe_key[160];
    snprintf(dedupe_key, sizeof(dedupe_key), "dedupe-%s", r.queue);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 8);
    pthread_t threads[8];
    struct producer producers[8];
    for (int i = 0; i < 8; i++) {
        producers[i] = (struct producer){ .queue = r.queue, .dedupe_key = dedupe_key,
                                          .barrier = &barrier };
        ck_assert_int_eq(pthread_create(&threads[i], NULL, produce, &producers[i]), 0);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&barrier);
    for (int i = 1; i < 8; i++)
        ck_assert_str_eq(producers[i].id, producers[0].id);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 1);
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .top_yaml = H_RELAY });
    H_WAIT(h_effects(&r, producers[0].id) == 1, 20000, "the one job should run");

    /* Its completion released the key: the next enqueue is a new job. */
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_dedupe WHERE dedupe_key = "
                            "'%s' AND released_at IS NOT NULL", dedupe_key) == 1, 20000,
           "completing the job should release its dedupe key");
    char first[128];
    snprintf(first, sizeof(first), "%s", producers[0].id);
    const char *second = h_enqueue(r.pg, r.queue, NULL, dedupe_key, NULL);
    ck_assert_str_ne(second, first);
    H_WAIT(h_effects(&r, second) == 1, 20000, "the second job should run");
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* The release trigger is skipped unless the job id has the shape of
 * sekali.enqueue()'s (a version-4 UUID): a job that came straight from a
 * producer on RabbitMQ costs PostgreSQL no plpgsql call at its completion.
 * Shown with a dedupe row planted for a plain id, which only the trigger
 * could release; and the same for an enqueue-shaped id, which it does. */
START_TEST(test_release_trigger_fires_only_for_ids_of_the_outbox_shape)
{
    h_init();
    PGconn *pg = h_pg();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "dedupeskip");
    static const char *const ids[] = { "plain-message-1", "0f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b" };
    for (int i = 0; i < 2; i++) {
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO sekali.job_dedupe (dedupe_key, queue, job_id, expires_at) "
                 "VALUES ('%s-%d', '%s', '%s', now() + interval '1 day');"
                 "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, job_id) "
                 "VALUES ('%s', 'k%d', 'processing', 1, '%s');"
                 "UPDATE sekali.idempotency_keys SET status = 'completed' "
                 "WHERE queue = '%s' AND key = 'k%d'",
                 queue, i, queue, ids[i], queue, i, ids[i], queue, i);
        h_pg_exec(pg, sql);
    }
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.job_dedupe WHERE queue = '%s' "
                                    "AND job_id = '%s' AND released_at IS NULL", queue, ids[0]), 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.job_dedupe WHERE queue = '%s' "
                                    "AND job_id = '%s' AND released_at IS NOT NULL", queue, ids[1]),
                     1);
    PQfinish(pg);
}
END_TEST

/* The dedupe key's row, as "held" (live, unreleased), "released", or "absent". */
static const char *dedupe_state(PGconn *pg, const char *dedupe_key, const char *job_id)
{
    if (h_pg_count(pg, "SELECT count(*) FROM sekali.job_dedupe WHERE dedupe_key = '%s' AND "
                       "job_id = '%s' AND released_at IS NULL", dedupe_key, job_id) == 1)
        return "held";
    if (h_pg_count(pg, "SELECT count(*) FROM sekali.job_dedupe WHERE dedupe_key = '%s' AND "
                       "job_id = '%s' AND released_at IS NOT NULL", dedupe_key, job_id) == 1)
        return "released";
    return "absent";
}

/* A released key hands the next enqueue a new job, not job_id, and it runs. */
static void expect_key_admits_a_new_job(struct h_run *r, const char *dedupe_key,
                                        const char *job_id)
{
    const char *next = h_enqueue(r->pg, r->queue, NULL, dedupe_key, NULL);
    ck_assert_str_ne(next, job_id);
    H_WAIT(h_effects(r, next) == 1, 20000, "the job enqueued after the release should run");
}

/* A worker SIGKILLed in the middle of a deduplicated job leaves the key
 * held (the job is not done); the rerun on redelivery completes it and
 * releases the key in the same transaction as its effect, after which the
 * key admits a new job. */
START_TEST(test_worker_killed_mid_job_leaves_no_dedupe_key_once_the_rerun_completes)
{
    struct h_run r;
    h_run_open(&r, "dedupekill");
    /* The dead worker's lock must expire before the rerun can take it. */
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = "    lock_ttl: 2s\n",
                                          .markers = true, .top_yaml = H_RELAY });
    char dedupe_key[160], job_id[128];
    snprintf(dedupe_key, sizeof(dedupe_key), "dedupe-%s", r.queue);
    snprintf(job_id, sizeof(job_id), "%s", h_enqueue_body(r.pg, r.queue, "stall", NULL,
                                                          dedupe_key, NULL));

    H_WAIT(h_stalled_pid(r.dir) != 0, 20000, "the handler never reached its stall point");
    pid_t victim = h_stalled_pid(r.dir);
    ck_assert_str_eq(dedupe_state(r.pg, dedupe_key, job_id), "held");
    ck_assert_str_eq(h_enqueue(r.pg, r.queue, NULL, dedupe_key, NULL), job_id);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead after SIGKILL",
           (long)victim);

    H_WAIT(h_effects(&r, job_id) == 1, 30000, "the killed job should run again and commit");
    /* Released by the commit that made the effect, so visible with it. */
    ck_assert_str_eq(dedupe_state(r.pg, dedupe_key, job_id), "released");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND pid = %ld", r.queue, (long)victim), 0);
    expect_key_admits_a_new_job(&r, dedupe_key, job_id);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* A job that fails is dead-lettered, and the transaction that records the
 * failure releases its dedupe key: a failed job must not block the key. */
START_TEST(test_dead_lettered_job_releases_its_dedupe_key)
{
    struct h_run r;
    h_run_open(&r, "dedupedead");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .top_yaml = H_RELAY });
    char dedupe_key[160], job_id[128];
    snprintf(dedupe_key, sizeof(dedupe_key), "dedupe-%s", r.queue);
    snprintf(job_id, sizeof(job_id), "%s", h_enqueue_body(r.pg, r.queue, "fail", NULL,
                                                          dedupe_key, NULL));
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "the failing job should be dead-lettered");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = '%s' AND status = 'failed'",
                                r.queue, job_id), 1);
    ck_assert_str_eq(dedupe_state(r.pg, dedupe_key, job_id), "released");
    expect_key_admits_a_new_job(&r, dedupe_key, job_id);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* A NOTIFY that reaches the relay while it works through a batch must not
 * be slept through. With an hour's poll interval (and AMQP heartbeats off,
 * which would wake the relay too), a job enqueued just behind another is
 * published at once, or not for an hour. The pairs are spaced 0 to 4 ms
 * apart, so that the second NOTIFY falls now before the relay's claim, now
 * in the middle of its batch: a relay that misses it fails here. */
START_TEST(test_job_enqueued_during_a_batch_is_not_left_for_the_poll_interval)
{
    struct h_run r;
    h_run_open(&r, "notify");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .heartbeat = "0s",
                                          .top_yaml = "outbox:\n  relays: 1\n"
                                                      "  poll_interval: 1h\n" });
    for (int i = 0; i < 25; i++) {
        char first[32], second[32];
        snprintf(first, sizeof(first), "k-%d-first", i);
        snprintf(second, sizeof(second), "k-%d-second", i);
        h_enqueue(r.pg, r.queue, first, NULL, NULL);
        nanosleep(&(struct timespec){ .tv_nsec = (i % 5) * 1000000L }, NULL);
        h_enqueue(r.pg, r.queue, second, NULL, NULL);
        H_WAIT(h_effects(&r, first) == 1 && h_effects(&r, second) == 1, 10000,
               "pair %d: both jobs should run, not wait for the poll interval", i);
    }
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_scheduled_job_is_not_published_before_run_at)
{
    struct h_run r;
    h_run_open(&r, "scheduled");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .top_yaml = H_RELAY });
    PGresult *res = PQexec(r.pg, "SELECT now() + interval '2 seconds'");
    char run_at[64];
    snprintf(run_at, sizeof(run_at), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    h_enqueue(r.pg, r.queue, "k-later", NULL, run_at);
    H_WAIT(h_effects(&r, "k-later") == 1, 20000, "the scheduled job should run after run_at");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND published_at >= run_at", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND created_at >= '%s'", r.queue, run_at), 1);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* One batch, and in its middle a row for a queue that does not exist: the
 * broker returns that message (mandatory), the row keeps a publish_error
 * and stays unpublished, and the rows around it are published and run.
 * Then the operator's way out that docs/guarantees.md gives works. */
START_TEST(test_unroutable_row_is_kept_its_batch_published_and_it_can_be_handed_back)
{
    struct h_run r;
    h_run_open(&r, "unroutable");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .top_yaml = H_RELAY });
    char missing[160];
    snprintf(missing, sizeof(missing), "%s-missing", r.queue);
    /* One transaction: one now(), so the relay's order is insertion order. */
    h_pg_exec(r.pg, "BEGIN");
    char key[32];
    for (int i = 1; i <= 10; i++) {
        snprintf(key, sizeof(key), "k-%d", i);
        h_enqueue(r.pg, r.queue, key, NULL, NULL);
        if (i == 5)
            h_enqueue(r.pg, missing, "k-missing", NULL, NULL);
    }
    h_pg_exec(r.pg, "COMMIT");
    H_WAIT(h_effects(&r, NULL) == 10, 20000, "the 10 routable jobs should run");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' AND "
                            "publish_error LIKE '%%no such queue%%' AND published_at IS NULL",
                      missing) == 1, 20000, "the unroutable row should hold its publish_error");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND published_at IS NOT NULL AND publish_error IS NULL",
                                r.queue), 10);
    ck_assert_int_eq(h_effect_keys(&r), 10);
    char want[256];
    snprintf(want, sizeof(want), "for queue %s not published", missing);
    ck_assert_int_eq(h_count_lines(r.log, want), 1);

    /* Once the queue exists, the UPDATE of docs/guarantees.md hands the row back and a
     * relay publishes it, once. */
    ck_assert_int_eq(sk_broker_declare(r.b, missing, NULL, NULL), SK_OK);
    char sql[512];
    snprintf(sql, sizeof(sql), "UPDATE sekali.outbox SET publish_error = NULL WHERE "
             "published_at IS NULL AND publish_error IS NOT NULL AND queue = '%s'", missing);
    h_pg_exec(r.pg, sql);
    H_WAIT(h_queue_depth(r.b, missing) == 1, 20000, "the handed-back row should reach %s",
           missing);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' AND "
                            "published_at IS NOT NULL AND publish_error IS NULL", missing) == 1,
           20000, "the handed-back row should be marked published");
    amqp_message_t msg;
    ck_assert(h_get(r.b, missing, &msg));
    amqp_destroy_message(&msg);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* A row whose publish the broker nacks (here a policy keeps its queue full
 * under reject-publish; a quorum queue electing its leader nacks alike)
 * is not refused: it keeps no publish_error, stays unpublished, and is
 * published once, by the relay's own retries, when the queue takes it. */
START_TEST(test_nacked_row_is_published_again_not_refused)
{
    struct h_run r;
    h_run_open(&r, "nackedrow");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = H_RELAY });
    char full[160], cmd[800];
    snprintf(full, sizeof(full), "%s-full", r.queue);
    snprintf(cmd, sizeof(cmd), "\"$SEKALI_RABBITMQCTL\" set_policy --apply-to queues --priority 1 "
             "%s '^%s$' '{\"max-length\":0,\"overflow\":\"reject-publish\"}' >/dev/null 2>&1",
             full, full);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(sk_broker_declare(r.b, full, NULL, NULL), SK_OK);
    h_enqueue(r.pg, full, "k-full", NULL, NULL);
    H_WAIT(h_count_lines(r.log, "nacked by the broker") >= 2, 20000,
           "the relay should be nacked and try the row again");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND published_at IS NULL AND publish_error IS NULL",
                                full), 1);
    ck_assert_int_eq(h_count_lines(r.log, "not published"), 0);
    snprintf(cmd, sizeof(cmd), "\"$SEKALI_RABBITMQCTL\" clear_policy %s >/dev/null 2>&1", full);
    ck_assert_int_eq(system(cmd), 0);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' AND "
                            "published_at IS NOT NULL AND publish_error IS NULL", full) == 1,
           20000, "the row should be published once the queue takes it");
    ck_assert_int_eq(h_queue_depth(r.b, full), 1);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* Calls sekali.enqueue() with these values; returns the SQLSTATE of its
 * error ("" if it enqueued) and copies the error message to msg. */
static const char *enqueue_error(PGconn *pg, const char *queue, const char *type,
                                 const char *key, const char *resource, const char *dedupe,
                                 char *msg, size_t size)
{
    static char state[8];
    const char *values[] = { queue, type, key, dedupe, resource };
    PGresult *res = PQexecParams(pg, "SELECT sekali.enqueue($1, $2, 'ok'::bytea, $3, $4, $5)",
                                 5, NULL, values, NULL, NULL, 0);
    const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    snprintf(state, sizeof(state), "%s", PQresultStatus(res) == PGRES_TUPLES_OK ? ""
                                         : code != NULL ? code : "?");
    snprintf(msg, size, "%s", PQresultErrorMessage(res));
    PQclear(res);
    return state;
}

/* s filled with n copies of c after prefix (at most size - 1 bytes). */
static char *padded(char *s, size_t size, const char *prefix, const char *c, size_t n)
{
    snprintf(s, size, "%s", prefix);
    for (size_t i = 0; i < n && strlen(s) + strlen(c) < size; i++)
        strcat(s, c);
    return s;
}

/* Values AMQP cannot carry, or workers would dead-letter, are refused by
 * sekali.enqueue() itself with a clear error and leave nothing behind;
 * values at the limits are taken. */
START_TEST(test_enqueue_refuses_what_could_never_be_published_and_enqueues_nothing)
{
    h_init();
    PGconn *pg = h_pg();
    char base[128], queue256[300], queue255[300], wide[300], type256[300], type255[300];
    char key513[600], dedupe[160], msg[512];
    h_unique_name(base, sizeof(base), "enqueue-limits");
    snprintf(dedupe, sizeof(dedupe), "dedupe-%s", base);
    padded(queue256, sizeof(queue256), base, "q", 256 - strlen(base));
    padded(queue255, sizeof(queue255), base, "q", 255 - strlen(base));
    /* 128 characters of 2 bytes: under 255 characters, over 255 bytes. */
    padded(wide, sizeof(wide), "", "\xc3\xa9", 128);
    padded(type256, sizeof(type256), "", "t", 256);
    padded(type255, sizeof(type255), "", "t", 255);
    padded(key513, sizeof(key513), "", "k", 513);

    static const struct { int queue; const char *type, *key, *resource, *state, *says; } cases[] = {
        { 256, "test", NULL, NULL, "22001", "queue name is 256 bytes long, over 255" },
        { 0, "test", NULL, NULL, "22023", "queue name is empty" },
        { 2, "test", NULL, NULL, "22001", "queue name is 256 bytes long, over 255" },
        { 1, "", NULL, NULL, "22023", "job type is empty" },
        { 1, "T256", NULL, NULL, "22001", "job type is 256 bytes long, over 255" },
        { 1, "test", "", NULL, "22023", "idempotency key is empty" },
        { 1, "test", "K513", NULL, "22001", "idempotency key is 513 bytes long, over 512" },
        { 1, "test", NULL, "", "22023", "resource key is empty" },
        { 1, "test", NULL, "K513", "22001", "resource key is 513 bytes long, over 512" },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(cases); i++) {
        const char *q = cases[i].queue == 256 ? queue256 : cases[i].queue == 0 ? ""
                        : cases[i].queue == 2 ? wide : base;
        const char *type = strcmp(cases[i].type, "T256") == 0 ? type256 : cases[i].type;
        const char *key = cases[i].key != NULL && strcmp(cases[i].key, "K513") == 0
                          ? key513 : cases[i].key;
        const char *resource = cases[i].resource != NULL &&
                               strcmp(cases[i].resource, "K513") == 0 ? key513
                                                                      : cases[i].resource;
        /* With a dedupe key too: the refusal comes before the key is taken. */
        const char *state = enqueue_error(pg, q, type, key, resource, dedupe, msg, sizeof(msg));
        ck_assert_msg(strcmp(state, cases[i].state) == 0 && strstr(msg, cases[i].says) != NULL,
                      "case %zu: expected SQLSTATE %s saying \"%s\", got \"%s\": %s", i,
                      cases[i].state, cases[i].says, state, msg);
    }
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.outbox WHERE queue LIKE "
                                    "'%s%%' OR queue = '' OR queue = '%s'", base, wide), 0);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.job_dedupe WHERE dedupe_key "
                                    "= '%s'", dedupe), 0);

    /* At the limits: taken, and the queue name's bytes counted, not its
     * characters. */
    char key512[600];
    padded(key512, sizeof(key512), "", "k", 512);
    ck_assert_str_eq(enqueue_error(pg, queue255, type255, key512, key512, NULL, msg,
                                   sizeof(msg)), "");
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                    "AND octet_length(job_type) = 255", queue255), 1);
    /* A content type AMQP cannot carry, or no header could hold. */
    const char *ctypes[] = { "", "text/csv\r\nX-Evil: 1", type256 }, *codes[] = { "22023",
                             "22023", "22001" };
    for (size_t i = 0; i < 3; i++) {
        const char *v[] = { base, ctypes[i] };
        PGresult *res = PQexecParams(pg, "SELECT sekali.enqueue($1, 'test', 'ok', "
                                         "p_content_type => $2)", 2, NULL, v, NULL, NULL, 0);
        const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        ck_assert_msg(code != NULL && strcmp(code, codes[i]) == 0 &&
                      strstr(PQresultErrorMessage(res), "content type is") != NULL,
                      "content type %zu: %s", i, PQresultErrorMessage(res));
        PQclear(res);
    }
    h_pg_exec(pg, "DELETE FROM sekali.outbox WHERE queue = '' OR queue LIKE 'enqueue-limits%'");
    PQfinish(pg);
}
END_TEST

/* The log's lines about a row of queue (or of a longer name starting
 * with it) that was not published. */
static int refusals_logged(const char *log, const char *queue)
{
    char *text = h_read_file(log);
    ck_assert_ptr_nonnull(text);
    char want[256];
    snprintf(want, sizeof(want), "for queue %s", queue);
    int n = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"))
        n += strstr(line, want) != NULL && strstr(line, "not published") != NULL;
    free(text);
    return n;
}

/* Rows inserted directly (as before sql/008, or bypassing sekali.enqueue())
 * that AMQP cannot carry: a queue name and a job type over 255 bytes, keys
 * too long for one frame. Each is refused with its publish_error, in the
 * same batch as good rows before and after it, which are published and run,
 * as is a job enqueued later; the relay never drops its connection. */
START_TEST(test_rows_amqp_cannot_carry_are_refused_and_the_rest_is_published)
{
    struct h_run r;
    h_run_open(&r, "unsendable");
    int port = h_free_port();
    char top[256];
    snprintf(top, sizeof(top), "%smetrics:\n  listen: 127.0.0.1:%d\n", H_RELAY, port);
    char sql[1024];
    h_pg_exec(r.pg, "BEGIN");
    h_enqueue(r.pg, r.queue, "k-1", NULL, NULL);
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.outbox (job_id, queue, job_type, body, "
             "idempotency_key) VALUES "
             "(gen_random_uuid()::text, '%s' || repeat('q', 300), 'test', 'ok', 'k-queue'), "
             "(gen_random_uuid()::text, '%s', repeat('t', 300), 'ok', 'k-type'), "
             "(gen_random_uuid()::text, '%s', 'test', 'ok', repeat('k', 200000))",
             r.queue, r.queue, r.queue);
    h_pg_exec(r.pg, sql);
    h_enqueue(r.pg, r.queue, "k-2", NULL, NULL);
    h_enqueue(r.pg, r.queue, "k-3", NULL, NULL);
    h_pg_exec(r.pg, "COMMIT");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });

    H_WAIT(h_effects(&r, "k-1") + h_effects(&r, "k-2") + h_effects(&r, "k-3") == 3, 20000,
           "the good rows of the batch should be published and run");
    h_enqueue(r.pg, r.queue, "k-later", NULL, NULL);
    H_WAIT(h_effects(&r, "k-later") == 1, 20000, "a job enqueued later should run");

    static const struct { const char *where, *why; } refused[] = {
        { "octet_length(queue) > 300", "queue name is longer than 255 bytes" },
        { "octet_length(job_type) = 300", "type (job type) is longer than 255 bytes" },
        { "octet_length(idempotency_key) = 200000", "do not fit in one AMQP frame" },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(refused); i++)
        ck_assert_msg(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue LIKE "
                                       "'%s%%' AND %s AND published_at IS NULL AND "
                                       "publish_error LIKE '%%%s%%'", r.queue,
                                 refused[i].where, refused[i].why) == 1,
                      "the row with %s should hold publish_error \"...%s...\"",
                      refused[i].where, refused[i].why);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND published_at IS NOT NULL", r.queue), 4);
    ck_assert_int_eq(refusals_logged(r.log, r.queue), 3);
    ck_assert_int_eq(h_count_events(r.log, "relay", "outage_begin", NULL), 0);

    /* Counted as refused rows; the over-long queue name as "other". */
    H_WAIT(h_metric(port, "sekali_outbox_published_total{queue=\"%s\"}", r.queue) == 4 &&
           h_metric(port, "sekali_outbox_unroutable_total{queue=\"%s\"}", r.queue) == 2 &&
           h_metric(port, "sekali_outbox_unroutable_total{queue=\"other\"}") >= 1 &&
           h_metric(port, "sekali_outbox_failed_rows{queue=\"%s\"}", r.queue) == 2, 20000,
           "the metrics should count 4 published and 3 refused rows: published %g, refused "
           "%g and %g (other), failed rows %g",
           h_metric(port, "sekali_outbox_published_total{queue=\"%s\"}", r.queue),
           h_metric(port, "sekali_outbox_unroutable_total{queue=\"%s\"}", r.queue),
           h_metric(port, "sekali_outbox_unroutable_total{queue=\"other\"}"),
           h_metric(port, "sekali_outbox_failed_rows{queue=\"%s\"}", r.queue));
    h_run_stop(&r);
    /* Refused rows wait for an operator for ever: this one deletes them. */
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.outbox WHERE queue LIKE '%s%%' AND "
             "published_at IS NULL", r.queue);
    h_pg_exec(r.pg, sql);
    h_run_close(&r);
}
END_TEST

static void broker_max_message_size(long bytes)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "\"$SEKALI_RABBITMQCTL\" eval "
             "'application:set_env(rabbit, max_message_size, %ld).' >/dev/null 2>&1", bytes);
    ck_assert_msg(system(cmd) == 0, "rabbitmqctl eval set_env max_message_size failed");
}

/* A row the broker itself refuses (a body over its max_message_size: it
 * closes the channel, without saying which message) is found by relaying
 * its batch one row at a time, and refused with the broker's reason; the
 * rows before and after it are published and run, and the relay reconnects
 * only for the refusals, never in a loop. RabbitMQ 3.x channels read the
 * limit when they open, so it is lowered before sekalid starts, and
 * restored after; RabbitMQ 4 reads it only at boot, and its default is
 * 16 MiB, so there the row is just over that. */
START_TEST(test_row_the_broker_refuses_is_found_and_the_rest_is_published)
{
    const char *v = getenv("SEKALI_RABBITMQ");
    bool four = v != NULL && atoi(v) >= 4;
    struct h_run r;
    h_run_open(&r, "brokerrefuses");
    h_pg_exec(r.pg, "BEGIN");
    h_enqueue(r.pg, r.queue, "k-1", NULL, NULL);
    h_enqueue(r.pg, r.queue, "k-2", NULL, NULL);
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', convert_to(repeat('x', "
             "%d), 'UTF8'), 'k-big')", r.queue, four ? (16 << 20) + 1024 : 20000);
    h_pg_exec(r.pg, sql);
    h_enqueue(r.pg, r.queue, "k-3", NULL, NULL);
    h_pg_exec(r.pg, "COMMIT");
    if (!four)
        broker_max_message_size(8192);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = H_RELAY });

    H_WAIT(h_effects(&r, "k-1") + h_effects(&r, "k-2") + h_effects(&r, "k-3") == 3, 30000,
           "the rows around the refused one should be published and run");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' AND "
                            "idempotency_key = 'k-big' AND published_at IS NULL AND "
                            "publish_error LIKE '%%406%%max size%%'", r.queue) == 1, 20000,
           "the big row should hold the broker's refusal as its publish_error");
    h_enqueue(r.pg, r.queue, "k-later", NULL, NULL);
    H_WAIT(h_effects(&r, "k-later") == 1, 20000, "a job enqueued later should run");
    if (!four)
        broker_max_message_size(134217728);
    ck_assert_int_eq(h_effects(&r, "k-big"), 0);
    ck_assert_int_eq(refusals_logged(r.log, r.queue), 1);
    /* Once for the batch, once for the row found alone. */
    ck_assert_int_eq(h_count_events(r.log, "relay", "outage_begin", "rabbitmq"), 1);
    ck_assert_int_eq(h_count_events(r.log, "relay", "relay_refused", "rabbitmq"), 1);
    h_run_stop(&r);
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.outbox WHERE queue = '%s' AND "
             "published_at IS NULL", r.queue);
    h_pg_exec(r.pg, sql);
    h_run_close(&r);
}
END_TEST

START_TEST(test_relay_killed_between_publish_and_mark_publishes_twice_runs_once)
{
    struct h_run r;
    h_run_open(&r, "relaymark");
    const char *env[] = { "SEKALI_FAILPOINT=after_publish:k-twice", "SEKALI_FAILPOINT_ONCE=1",
                          NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 2,
                                          .top_yaml = H_RELAY });
    h_enqueue(r.pg, r.queue, "k-twice", NULL, NULL);
    H_WAIT(access(r.mark, F_OK) == 0, 20000, "the relay should die between publish and mark");
    H_WAIT(h_duplicates(&r) == 1, 30000,
           "the second publish should arrive as a counted duplicate");
    ck_assert_int_eq(h_effects(&r, "k-twice"), 1);
    /* The new relay commits its mark after the confirm, which may come
     * after the worker already took the copy in. */
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' AND "
                            "published_at IS NOT NULL", r.queue) == 1, 20000,
           "the second relay should mark the row published");
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* 5,000 jobs enqueued in one transaction, two relays: every row published
 * once (no duplicate arrives: SKIP LOCKED kept the relays apart), every
 * effect once. */
START_TEST(test_two_relays_publish_five_thousand_rows_once_each)
{
    struct h_run r;
    h_run_open(&r, "tworelays");
    h_run_start(&r, &(struct h_run_opts){ .workers = 4, .top_yaml = RELAYS });
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT count(sekali.enqueue('%s', 'test', 'ok'::bytea, "
             "'k-' || i)) FROM generate_series(1, 5000) AS i", r.queue);
    ck_assert_int_eq(h_pg_count(r.pg, "%s", sql), 5000);
    H_WAIT(h_completed(&r) == 5000, 120000, "5000 jobs should complete, %lld did",
           h_completed(&r));
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND published_at IS NULL", r.queue), 0);
    ck_assert_int_eq(h_count_events(r.log, "relay", SK_EVENT_STARTED, NULL), 2);
    h_run_stop(&r);
    h_expect_once(&r, 5000, 0);
    h_run_close(&r);
}
END_TEST

/* Chains A -> B -> C: each job enqueues the next in its own transaction
 * (host->enqueue). Workers are killed while the chains run; every link must
 * still happen exactly once. */
START_TEST(test_job_chains_survive_worker_kills_with_each_link_once)
{
    struct h_run r;
    /* No lock: a killed worker's lock would send its job's redelivery
     * through a delay queue, whose copy may come back after the stop. And no
     * crash limit: these kills are the test's, and one link may be in hand
     * at two or three of them, which max_crashes would rightly take for a
     * crash loop. */
    h_run_open(&r, "chain");
    h_run_start(&r, &(struct h_run_opts){ .workers = 3,
                                          .queue_yaml = "    lock: false\n    max_crashes: 0\n",
                                          .top_yaml = H_RELAY });
    for (int i = 0; i < 20; i++) {
        char key[32];
        snprintf(key, sizeof(key), "chain-%d", i);
        const char *values[] = { r.queue, key };
        PGresult *res = PQexecParams(r.pg, "SELECT sekali.enqueue($1, 'test', "
                                           "'chain:2'::bytea, $2)", 2, NULL, values, NULL,
                                     NULL, 0);
        ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
        PQclear(res);
    }
    int kills = 0;
    for (long long seen = 0; kills < 3 && seen < 50; kills++) {
        H_WAIT(h_effects(&r, NULL) > seen, 30000, "the chains should advance");
        seen = h_effects(&r, NULL);
        long long victim = h_pg_count(r.pg, "SELECT pid FROM sekali_test.effects WHERE queue = "
                                            "'%s' ORDER BY id DESC LIMIT 1", r.queue);
        kill((pid_t)victim, SIGKILL);
        H_WAIT(h_process_gone((pid_t)victim), 10000, "worker %lld should die", victim);
    }
    ck_assert_int_ge(kills, 1);
    H_WAIT(h_effects(&r, NULL) >= 60, 60000, "all 60 links should run");
    h_run_stop(&r);
    h_expect_once(&r, 60, H_ANY_DUPS);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND idempotency_key LIKE '%%++'", r.queue), 20);
    h_run_close(&r);
}
END_TEST

/* host->enqueue_job() (ABI 1.3) passes every option of sekali.enqueue():
 * the handler's follow-up carries its resource key and its priority (ABI
 * 1.6), waits for its run_at, and holds its dedupe key for the TTL it
 * asked for. */
START_TEST(test_enqueue_job_passes_run_at_resource_key_and_dedupe_ttl)
{
    struct h_run r;
    h_run_open(&r, "enqopts");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    h_publish(r.b, r.queue, "test", "opts-1", NULL, NULL, "options");
    H_WAIT(h_effects(&r, "opts-1") == 1, 20000, "the job should run");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND job_type = 'later' AND idempotency_key = "
                                      "'opts-1/later' AND resource_key = 'res-opts-1' AND "
                                      "run_at = '2100-01-01 00:00:00+00' AND priority = 7 "
                                      "AND published_at IS NULL", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_dedupe d JOIN "
                                      "sekali.outbox o USING (job_id) WHERE o.queue = '%s' AND "
                                      "d.dedupe_key = 'dedupe-' || o.queue || '-opts-1' AND "
                                      "d.expires_at BETWEEN now() + interval '55 minutes' AND "
                                      "now() + interval '61 minutes'", r.queue), 1);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* A priority sekali.enqueue() refuses (AMQP's is one octet) fails the
 * handler's enqueue_job() with sekali.enqueue()'s reason: the job fails
 * (dead-lettered here, at its one attempt), nothing is enqueued. A
 * priority of 0 is none. */
START_TEST(test_enqueue_job_refuses_a_priority_outside_an_octet)
{
    struct h_run r;
    h_run_open(&r, "enqprio");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1,
                                          .queue_yaml = "    retry:\n      max_attempts: 1\n" });
    h_publish(r.b, r.queue, "test", "prio-0", NULL, NULL, "priority:0");
    h_publish(r.b, r.queue, "test", "prio-300", NULL, NULL, "priority:300");
    H_WAIT(h_effects(&r, "prio-0") == 1, 20000, "the job with priority 0 should run");
    H_WAIT(h_count_lines(r.log, "outside 0..255") >= 1, 20000,
           "the enqueue with priority 300 should fail with sekali.enqueue()'s reason");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND idempotency_key = 'prio-0/later' AND priority IS "
                                      "NULL", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND idempotency_key = 'prio-300/later'", r.queue), 0);
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "the failed job should be dead-lettered");
    ck_assert_int_eq(h_effects(&r, "prio-300"), 0);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* One job's id, as sekali.enqueue() returns it for dedupe key `dedupe` held
 * for ttl, scheduled far ahead so that nothing runs it (or releases it). */
static char *enqueue_held(PGconn *pg, const char *queue, const char *dedupe, const char *ttl)
{
    char sql[1024];
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'ok', NULL, '%s', NULL, "
             "'2100-01-01', interval '%s')", queue, dedupe, ttl);
    PGresult *res = PQexec(pg, sql);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s", PQerrorMessage(pg));
    char *id = strdup(PQgetvalue(res, 0, 0));
    PQclear(res);
    return id;
}

START_TEST(test_a_dedupe_key_expires_after_its_ttl)
{
    struct h_run r;
    h_run_open(&r, "dedupettl");
    char dedupe[160];
    snprintf(dedupe, sizeof(dedupe), "ttl-%s", r.queue);
    char *first = enqueue_held(r.pg, r.queue, dedupe, "1 second");
    /* Within its TTL the key holds: the same job again, nothing new. */
    char *again = enqueue_held(r.pg, r.queue, dedupe, "1 second");
    ck_assert_str_eq(again, first);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 1);
    /* Past it, though its job never ran and never released it, a new job. */
    char *later = NULL;
    H_WAIT((free(later), later = enqueue_held(r.pg, r.queue, dedupe, "1 hour"),
            strcmp(later, first) != 0), 10000,
           "the dedupe key should expire after its 1 s TTL; still job %s", later);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_dedupe WHERE "
                                      "dedupe_key = '%s' AND job_id = '%s'", dedupe, later), 1);
    char sql[512];
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.outbox WHERE queue = '%s'", r.queue);
    h_pg_exec(r.pg, sql);
    free(first);
    free(again);
    free(later);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_enqueue_in_a_rolled_back_transaction_publishes_nothing,
        test_one_dedupe_key_from_eight_connections_gives_one_job,
        test_worker_killed_mid_job_leaves_no_dedupe_key_once_the_rerun_completes,
        test_dead_lettered_job_releases_its_dedupe_key,
        test_release_trigger_fires_only_for_ids_of_the_outbox_shape,
        test_job_enqueued_during_a_batch_is_not_left_for_the_poll_interval,
        test_scheduled_job_is_not_published_before_run_at,
        test_unroutable_row_is_kept_its_batch_published_and_it_can_be_handed_back,
        test_nacked_row_is_published_again_not_refused,
        test_enqueue_refuses_what_could_never_be_published_and_enqueues_nothing,
        test_rows_amqp_cannot_carry_are_refused_and_the_rest_is_published,
        test_row_the_broker_refuses_is_found_and_the_rest_is_published,
        test_relay_killed_between_publish_and_mark_publishes_twice_runs_once,
        test_two_relays_publish_five_thousand_rows_once_each,
        test_job_chains_survive_worker_kills_with_each_link_once,
        test_enqueue_job_passes_run_at_resource_key_and_dedupe_ttl,
        test_enqueue_job_refuses_a_priority_outside_an_octet,
        test_a_dedupe_key_expires_after_its_ttl,
        NULL,
    };
    return h_run_suite(h_suite("outbox", 300, tests));
}
