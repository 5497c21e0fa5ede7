/* lock.c - Redis lease lock: acquire with SET NX PX, renew and release by
 * owner token through server-side scripts.
 *
 * The scripts are loaded once per connection and called by SHA; if Redis lost
 * them (restart, SCRIPT FLUSH) they are loaded again and the call repeated. A
 * failed connection is freed at once and reopened lazily on the next call, so
 * callers see SK_AGAIN and decide how to back off. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "lock.h"

/* KEYS[1] = lock key, ARGV[1] = owner token, ARGV[2] = ttl in ms. */
static const char renew_script[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
static const char release_script[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end";

struct sk_lock {
    const struct sk_redis_conf *conf;
    redisContext               *ctx;
    char                        renew_sha[41];
    char                        release_sha[41];
};

static int ensure_connected(struct sk_lock *l, struct sk_err *err);
static void disconnect(struct sk_lock *l);
static int load_script(struct sk_lock *l, const char *script, char sha[41], struct sk_err *err);
static int run_script(struct sk_lock *l, const char *script, char sha[41], const char *key,
                      const char *token, const char *ttl, struct sk_err *err);
static int reply_error(struct sk_lock *l, redisReply *reply, const char *what,
                       struct sk_err *err);
static bool refused_login(const char *reply);

int sk_lock_open(struct sk_lock **out, const struct sk_redis_conf *conf, struct sk_err *err)
{
    struct sk_lock *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(lock)");
    l->conf = conf;
    int rc = ensure_connected(l, err);
    if (rc != SK_OK) {
        sk_lock_close(l);
        return rc;
    }
    *out = l;
    return SK_OK;
}

void sk_lock_close(struct sk_lock *l)
{
    if (l == NULL)
        return;
    disconnect(l);
    free(l);
}

void sk_lock_key(char *out, size_t size, const char *queue, const char *resource)
{
    snprintf(out, size, "sekali:lock:%s:%s", queue, resource);
}

void sk_lock_new_token(char token[SK_LOCK_TOKEN_LEN + 1])
{
    sk_random_hex(token, SK_LOCK_TOKEN_LEN);
}

int sk_lock_acquire(struct sk_lock *l, const char *key, const char *token, uint32_t ttl_ms,
                    struct sk_err *err)
{
    int rc = ensure_connected(l, err);
    if (rc != SK_OK)
        return rc;
    redisReply *reply = redisCommand(l->ctx, "SET %s %s NX PX %u", key, token, ttl_ms);
    if (reply == NULL || reply->type == REDIS_REPLY_ERROR)
        return reply_error(l, reply, "SET NX PX", err);
    /* A nil reply means NX found the key: someone else holds it. */
    rc = reply->type == REDIS_REPLY_STATUS ? SK_OK : SK_BUSY;
    freeReplyObject(reply);
    return rc;
}

int sk_lock_renew(struct sk_lock *l, const char *key, const char *token, uint32_t ttl_ms,
                  struct sk_err *err)
{
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%u", ttl_ms);
    return run_script(l, renew_script, l->renew_sha, key, token, ttl, err);
}

int sk_lock_release(struct sk_lock *l, const char *key, const char *token, struct sk_err *err)
{
    return run_script(l, release_script, l->release_sha, key, token, NULL, err);
}

static int ensure_connected(struct sk_lock *l, struct sk_err *err)
{
    if (l->ctx != NULL)
        return SK_OK;
    struct timeval timeout = { .tv_sec = l->conf->timeout_ms / 1000,
                               .tv_usec = (suseconds_t)(l->conf->timeout_ms % 1000) * 1000 };
    l->ctx = redisConnectWithTimeout(l->conf->host, l->conf->port, timeout);
    if (l->ctx == NULL)
        return sk_err_set(err, SK_AGAIN, "redisConnect(%s:%d) failed: out of memory",
                          l->conf->host, l->conf->port);
    if (l->ctx->err != 0) {
        sk_err_set(err, SK_AGAIN, "redisConnect(%s:%d) failed: %s", l->conf->host,
                   l->conf->port, l->ctx->errstr);
        disconnect(l);
        return SK_AGAIN;
    }
    /* Commands get the same bound as the connect: a stalled Redis must turn
     * into SK_AGAIN, never into a worker stuck holding a delivery. */
    redisSetTimeout(l->ctx, timeout);

    redisReply *reply;
    if (l->conf->password != NULL) {
        reply = redisCommand(l->ctx, "AUTH %s", l->conf->password);
        if (reply == NULL || reply->type == REDIS_REPLY_ERROR)
            return reply_error(l, reply, "AUTH", err);
        freeReplyObject(reply);
    }
    if (l->conf->db != 0) {
        reply = redisCommand(l->ctx, "SELECT %d", l->conf->db);
        if (reply == NULL || reply->type == REDIS_REPLY_ERROR)
            return reply_error(l, reply, "SELECT", err);
        freeReplyObject(reply);
    }
    int rc = load_script(l, renew_script, l->renew_sha, err);
    if (rc == SK_OK)
        rc = load_script(l, release_script, l->release_sha, err);
    return rc;
}

static void disconnect(struct sk_lock *l)
{
    if (l->ctx != NULL)
        redisFree(l->ctx);
    l->ctx = NULL;
}

static int load_script(struct sk_lock *l, const char *script, char sha[41], struct sk_err *err)
{
    redisReply *reply = redisCommand(l->ctx, "SCRIPT LOAD %s", script);
    if (reply == NULL || reply->type != REDIS_REPLY_STRING || reply->len != 40)
        return reply_error(l, reply, "SCRIPT LOAD", err);
    memcpy(sha, reply->str, 41);
    freeReplyObject(reply);
    return SK_OK;
}

static int run_script(struct sk_lock *l, const char *script, char sha[41], const char *key,
                      const char *token, const char *ttl, struct sk_err *err)
{
    int rc = ensure_connected(l, err);
    if (rc != SK_OK)
        return rc;
    for (int attempt = 0;; attempt++) {
        redisReply *reply = ttl != NULL
            ? redisCommand(l->ctx, "EVALSHA %s 1 %s %s %s", sha, key, token, ttl)
            : redisCommand(l->ctx, "EVALSHA %s 1 %s %s", sha, key, token);
        if (reply != NULL && reply->type == REDIS_REPLY_ERROR && attempt == 0 &&
            strncmp(reply->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(reply);
            rc = load_script(l, script, sha, err);
            if (rc != SK_OK)
                return rc;
            continue;
        }
        if (reply == NULL || reply->type != REDIS_REPLY_INTEGER)
            return reply_error(l, reply, "EVALSHA", err);
        rc = reply->integer == 1 ? SK_OK : SK_BUSY;
        freeReplyObject(reply);
        return rc;
    }
}

/* NOAUTH: Redis wants a password we did not give; WRONGPASS (Redis 6 and
 * later) or "invalid password" (before): it is not the one we gave; "AUTH
 * ... called without any password configured": we give one it does not have. */
static bool refused_login(const char *reply)
{
    return strncmp(reply, "NOAUTH", 6) == 0 || strncmp(reply, "WRONGPASS", 9) == 0 ||
           strncmp(reply, "ERR invalid password", 20) == 0 ||
           strncmp(reply, "ERR AUTH", 8) == 0;
}

/* Any failure drops the connection: after a timeout hiredis may still have a
 * reply in flight, and reading it as the answer to the next command would
 * attribute one key's answer to another. */
static int reply_error(struct sk_lock *l, redisReply *reply, const char *what,
                       struct sk_err *err)
{
    if (reply == NULL) {
        sk_err_set(err, SK_AGAIN, "redis %s failed: %s", what,
                   l->ctx != NULL ? l->ctx->errstr : "not connected");
    } else if (reply->type == REDIS_REPLY_ERROR) {
        sk_err_set(err, SK_AGAIN, "redis %s failed: %s", what, reply->str);
        if (refused_login(reply->str))
            sk_err_mark_auth(err, SK_AGAIN);
    } else {
        sk_err_set(err, SK_AGAIN, "redis %s: unexpected reply type %d", what, reply->type);
    }
    if (reply != NULL)
        freeReplyObject(reply);
    disconnect(l);
    return SK_AGAIN;
}
