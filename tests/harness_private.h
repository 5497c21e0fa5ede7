/* harness_private.h - what the harness's files share with each other and
 * not with the suites: the settings h_init() read, and small helpers that
 * more than one of them needs. The suites include harness.h only. */
#ifndef SK_HARNESS_PRIVATE_H
#define SK_HARNESS_PRIVATE_H

#include <stdio.h>

#include <hiredis/hiredis.h>

#include "harness.h"

/* The value of a SEKALI_* variable, or fails the test pointing at
 * tests/run.sh when it is missing. */
const char *h_require_env(const char *name);

/* The test broker as sk_broker_open() takes it, parsed by h_init() from
 * SEKALI_AMQP_URL. */
const struct sk_amqp_conf *h_amqp_conf(void);

/* All of in, NUL-terminated; the caller frees it. */
char *h_read_stream(FILE *in);

/* A connection to the test Redis's plain port, or fails the test. */
redisContext *h_redis_connect(void);

/* `rabbitmqctl -q ARGS` as a pipe to read (ARGS a list_* command); close
 * with pclose(). */
FILE *h_rabbitmqctl(const char *args);

/* SEKALI_TEST_TLS=1: asserts from the servers' side that sekalid's links
 * are TLS (harness_servers.c). */
void h_expect_tls_links(struct h_run *r, int amqp_at_least, int pg_at_least,
                        int redis_at_least);

#endif
