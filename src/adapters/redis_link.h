/* redis_link.h - one connection to a Redis server or sentinel, in clear
 * text or over TLS, speaking RESP through hiredis's reply reader.
 *
 * Debian 12's hiredis (0.14) has no TLS: this file owns the stream (a TCP
 * socket, with OpenSSL over it when TLS is asked for) and leaves to
 * hiredis what it does well, formatting commands (redisFormatCommand) and
 * reading replies (redisReader). One link is owned by one thread. Every
 * blocking call is bounded by the timeout the link was opened with. */
#ifndef SK_REDIS_LINK_H
#define SK_REDIS_LINK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "common.h"
#include "tls.h"

struct sk_redis_link;

/* Connects to host:port within timeout_ms (each address getaddrinfo()
 * gives, in turn) and, when tls is enabled, completes a verified TLS
 * handshake (tls.c); never falls back to clear text. Returns SK_OK with
 * *out the caller's, or SK_AGAIN with err naming host:port and the cause. */
int  sk_redis_link_open(struct sk_redis_link **out, const char *host, int port,
                        const struct sk_tls_conf *tls, uint32_t timeout_ms, struct sk_err *err);
void sk_redis_link_close(struct sk_redis_link *l);
/* Bounds each later read and write at timeout_ms (a call may take several):
 * the renewal thread narrows it to what is left of a lease. SK_OK or
 * SK_AGAIN (setsockopt failed: the old bound stays). */
int  sk_redis_link_set_timeout(struct sk_redis_link *l, uint32_t timeout_ms);

/* Queues an already formatted command (RESP); sent by the next
 * sk_redis_link_reply(). Returns REDIS_OK, or REDIS_ERR out of memory. */
int sk_redis_link_append(struct sk_redis_link *l, const char *cmd, size_t len);

/* Sends what is queued, then reads one reply: REDIS_OK with *reply (the
 * caller frees it with freeReplyObject()), or REDIS_ERR with
 * sk_redis_link_errstr() saying why; the link is then unusable. */
int sk_redis_link_reply(struct sk_redis_link *l, redisReply **reply);

/* redisCommand()'s equivalent: formats, sends, and returns the reply, or
 * NULL on failure (sk_redis_link_errstr()). */
redisReply *sk_redis_link_command(struct sk_redis_link *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The least of this connection's last 8 round trips (a pipeline sent and
 * its first reply), in ns; 0 before the first. */
uint64_t sk_redis_link_rtt_ns(const struct sk_redis_link *l);

/* Why the last call failed ("" if none). Never holds a command's text. */
const char *sk_redis_link_errstr(const struct sk_redis_link *l);
const char *sk_redis_link_host(const struct sk_redis_link *l);
int         sk_redis_link_port(const struct sk_redis_link *l);
/* Whether the last call failed for a setting (SK_SETTING in common.h): in
 * TLS 1.3 a server refuses our certificate only at the first read. */
bool        sk_redis_link_setting(const struct sk_redis_link *l);
/* Whether the link is TLS (for tests and status). */
bool        sk_redis_link_tls(const struct sk_redis_link *l);

#endif
