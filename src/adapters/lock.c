/* lock.c - Redis lease lock: acquire with SET NX PX, renew and release by
 * owner token through server-side scripts.
 *
 * Acquiring is a script too (swap_script: SET NX PX for each key), which
 * first releases the locks the caller's previous jobs left: a worker's
 * release travels with its next acquire, one command and one round trip
 * for both (sk_lock_swap_many()).
 *
 * The scripts are loaded once per connection and called by SHA; if Redis lost
 * them (restart, SCRIPT FLUSH) they are loaded again and the call repeated. A
 * failed connection is freed at once and reopened lazily on the next call, so
 * callers see SK_AGAIN and decide how to back off.
 *
 * With redis.sentinels, every (re)connect first asks the sentinels, in turn,
 * which server is the master now (SENTINEL get-master-addr-by-name; hiredis
 * has no Sentinel support, and one command needs none), then checks with ROLE
 * that the server named is a master indeed: a sentinel that is itself cut off
 * may still name the old one. Since any error drops the connection, a
 * failover is followed at the next call: the old master refuses writes
 * (READONLY) or is gone, and the reconnect asks again.
 *
 * The per-job commands (EVALSHA of the scripts) are written in Redis's wire
 * protocol by hand, a few copies into a buffer the connection keeps (the
 * TTL's digits made once) and handed to hiredis already formatted:
 * redisCommand() would parse its format string and build the command
 * through a dozen allocations on every call, which was most of a job's
 * lock cost.
 *
 * The stream is redis_link.c's, clear or TLS (redis.tls): hiredis formats
 * and reads, the link carries the bytes. Logging in is AUTH with
 * redis.username when one is given (a Redis 6 ACL user), the sentinels
 * with sentinel_username and their own password. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>

#include <hiredis/hiredis.h>

#include "lock.h"
#include "redis_link.h"

/* A key is either a plain lock (a string holding its owner's token) or,
 * for a queue with `concurrency` above 1, a semaphore: a sorted set of the
 * holders' tokens, each scored with its own expiry in ms on Redis's clock
 * (TIME, never ours), the key itself kept alive as long as its last holder.
 * A holder past its expiry counts for nothing: it is dropped before every
 * admission and may not renew, so no permit outlives its lease. Renewal and
 * release work on both, and a queue's concurrency changed under a held key
 * leaves it busy until it expires. They tell the two apart by GET's
 * WRONGTYPE rather than by TYPE, so that a plain lock's ACL stays the
 * commands it always was (docs/tls.md); only a semaphore needs more. */
#define SEM_NOW "local tm = redis.call('time') local now = tm[1] * 1000 + math.floor(tm[2] / 1000) "
/* The key outlives every holder: its expiry only ever moves later. */
#define SEM_KEEP(k, ttl) "if redis.call('pttl', " k ") < tonumber(" ttl ") then " \
    "redis.call('pexpire', " k ", " ttl ") end "
/* v = GET k, and is_set whether k is a semaphore; any other error is the
 * script's (a refused command says so). */
#define GET_OR_SET(k) "local v, is_set = redis.pcall('get', " k "), false " \
    "if type(v) == 'table' and v.err then " \
    "if not string.find(v.err, 'WRONGTYPE', 1, true) then return redis.error_reply(v.err) end " \
    "is_set = true end "

/* KEYS[1] = lock key, ARGV[1] = owner token, ARGV[2] = ttl in ms. */
static const char renew_script[] =
    GET_OR_SET("KEYS[1]")
    "if is_set then " SEM_NOW
    "local s = redis.call('zscore', KEYS[1], ARGV[1]) "
    "if not s or tonumber(s) <= now then return 0 end "
    "redis.call('zadd', KEYS[1], 'XX', now + ARGV[2], ARGV[1]) " SEM_KEEP("KEYS[1]", "ARGV[2]")
    "return 1 end "
    "if v == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
static const char release_script[] =
    GET_OR_SET("KEYS[1]")
    "if is_set then return redis.call('zrem', KEYS[1], ARGV[1]) end "
    "if v == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end";
/* KEYS = the r locks to release, then those to take; ARGV[1] = r, ARGV[2] =
 * ttl in ms, ARGV[3] = the holders a key admits, ARGV[3 + i] = KEYS[i]'s
 * token. One integer a key: 1 released or taken, 0 not ours any more or
 * held by another (by as many others as it admits). Releases come first,
 * so a job may take back the lock its predecessor on the resource left. */
static const char swap_script[] =
    "local r, lim, now, out = tonumber(ARGV[1]), tonumber(ARGV[3]), nil, {} "
    "for i = 1, #KEYS do "
    "local k, t = KEYS[i], ARGV[i + 3] "
    "if i <= r then " GET_OR_SET("k")
    "if is_set then out[i] = redis.call('zrem', k, t) "
    "elseif v == t then out[i] = redis.call('del', k) "
    "else out[i] = 0 end "
    "elseif lim <= 1 then "
    "if redis.call('set', k, t, 'NX', 'PX', ARGV[2]) then out[i] = 1 else out[i] = 0 end "
    "else "
    "local ty = redis.call('type', k).ok "
    "if ty ~= 'zset' and ty ~= 'none' then out[i] = 0 "
    "else "
    "if not now then local tm = redis.call('time') "
    "now = tm[1] * 1000 + math.floor(tm[2] / 1000) end "
    "redis.call('zremrangebyscore', k, '-inf', now) "
    "if redis.call('zcard', k) < lim then "
    "redis.call('zadd', k, now + ARGV[2], t) " SEM_KEEP("k", "ARGV[2]") "out[i] = 1 "
    "else out[i] = 0 end "
    "end "
    "end "
    "end "
    "return out";

struct sk_lock {
    const struct sk_redis_conf *conf;
    uint32_t                    timeout_ms; /* connect and command bound of this connection */
    struct sk_redis_link       *ctx;
    size_t                      sentinel;  /* the one to ask first: the last that answered */
    char                        renew_sha[41];
    char                        release_sha[41];
    char                        swap_sha[41];
    char                       *cmd;       /* the command being built; grows, never shrinks */
    size_t                      cmd_size;
    size_t                      cmd_len;
    uint32_t                    ttl_ms;    /* the TTL last asked for, and its text */
    char                        ttl[16];
};

static const char *ttl_text(struct sk_lock *l, uint32_t ttl_ms);
static bool cmd_start(struct sk_lock *l, int argc, size_t need);
static void cmd_arg(struct sk_lock *l, const char *arg, size_t len);
static redisReply *cmd_send(struct sk_lock *l);
static bool put_eval(struct sk_lock *l, const char *sha, size_t n_keys, const char *const *keys,
                     size_t n_args, const char *const *args);
static bool put_swap(struct sk_lock *l, size_t n_release, size_t n, const char *const *keys,
                     const char *const *tokens, uint32_t ttl_ms, int limit);
static int read_ints(struct sk_lock *l, redisReply *reply, long long *out, size_t n_out,
                     struct sk_err *err);
static void ride_answer(struct sk_lock *l, struct sk_lock_ride *ride, redisReply *reply,
                        int status, const struct sk_err *err);

static int ensure_connected(struct sk_lock *l, struct sk_err *err);
static int connect_server(struct sk_lock *l, const char *host, int port, struct sk_err *err);
static int connect_master(struct sk_lock *l, struct sk_err *err);
static int ask_sentinel(const struct sk_lock *l, const struct sk_addr *s, char *host,
                        size_t host_len, int *port, struct sk_err *err);
static int check_master(struct sk_lock *l, struct sk_err *err);
static int log_in(struct sk_redis_link *ctx, const char *user, const char *password,
                  struct sk_err *err);
static void disconnect(struct sk_lock *l);
static int load_scripts(struct sk_lock *l, struct sk_err *err);
static bool append_argv(struct sk_lock *l, int argc, const char **argv);
static int load_script(struct sk_lock *l, const char *script, char sha[41], struct sk_err *err);
static int script_many(struct sk_lock *l, const char *script, char sha[41], size_t n,
                       const char *const *keys, const char *const *tokens, const char *ttl,
                       int *rc, struct sk_err *err);
static int run_script(struct sk_lock *l, const char *script, char sha[41], const char *key,
                      const char *token, const char *ttl, struct sk_err *err);
static int reply_error(struct sk_lock *l, redisReply *reply, const char *what,
                       struct sk_err *err);
static bool refused_login(const char *reply);
static bool script_refused(const char *reply);
static int script_trouble(struct sk_lock *l, redisReply *reply, int attempt, const char *script,
                          char sha[41], const char *what, const char *runs, struct sk_err *err);

int sk_lock_open(struct sk_lock **out, const struct sk_redis_conf *conf, struct sk_err *err)
{
    return sk_lock_open_bounded(out, conf, conf->timeout_ms, err);
}

int sk_lock_open_bounded(struct sk_lock **out, const struct sk_redis_conf *conf,
                         uint32_t timeout_ms, struct sk_err *err)
{
    struct sk_lock *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(lock)");
    l->conf = conf;
    l->timeout_ms = timeout_ms > 0 ? timeout_ms : conf->timeout_ms;
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
    free(l->cmd);
    free(l);
}

void sk_lock_key(char *out, size_t size, const char *queue, const char *resource)
{
    snprintf(out, size, "sekali:lock:%s:%s", queue, resource);
}

/* A token is this process's random prefix and a counter: no system call
 * per job. What the token must do is tell one lease holder from every
 * other, and it does: the counter never repeats within a process (64 bits),
 * and two processes differ in their 64-bit prefixes from sk_random_hex()
 * (a collision needs some 2^32 processes alive at once). A forked child
 * draws again, so workers forked from one supervisor never share a prefix.
 * It is no secret from those who can read Redis or the logs, but it never
 * was: whoever reaches Redis can delete the lock outright. */
static char                 token_prefix[SK_LOCK_TOKEN_LEN / 2 + 1];
static _Atomic uint64_t     token_counter;
static pthread_once_t       token_once = PTHREAD_ONCE_INIT;

/* Also the fork handler: the child is single-threaded when it runs. */
static void draw_token_prefix(void)
{
    sk_random_hex(token_prefix, SK_LOCK_TOKEN_LEN / 2);
    atomic_store(&token_counter, 0);
}

static void init_tokens(void)
{
    draw_token_prefix();
    pthread_atfork(NULL, NULL, draw_token_prefix);
}

void sk_lock_new_token(char token[SK_LOCK_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    pthread_once(&token_once, init_tokens);
    uint64_t n = atomic_fetch_add(&token_counter, 1);
    memcpy(token, token_prefix, SK_LOCK_TOKEN_LEN / 2);
    for (size_t i = SK_LOCK_TOKEN_LEN; i > SK_LOCK_TOKEN_LEN / 2; i--, n >>= 4)
        token[i - 1] = hex[n & 0x0f];
    token[SK_LOCK_TOKEN_LEN] = '\0';
}

int sk_lock_acquire(struct sk_lock *l, const char *key, const char *token, uint32_t ttl_ms,
                    struct sk_err *err)
{
    int rc = ensure_connected(l, err);
    if (rc != SK_OK)
        return rc;
    const char *ttl = ttl_text(l, ttl_ms);
    size_t key_len = strlen(key), token_len = strlen(token);
    redisReply *reply = NULL;
    if (cmd_start(l, 6, key_len + token_len + strlen(ttl) + 16)) {
        cmd_arg(l, "SET", 3);
        cmd_arg(l, key, key_len);
        cmd_arg(l, token, token_len);
        cmd_arg(l, "NX", 2);
        cmd_arg(l, "PX", 2);
        cmd_arg(l, ttl, strlen(ttl));
        reply = cmd_send(l);
    }
    if (reply == NULL || reply->type == REDIS_REPLY_ERROR)
        return reply_error(l, reply, "SET NX PX", err);
    /* A nil reply means NX found the key: someone else holds it. */
    rc = reply->type == REDIS_REPLY_STATUS ? SK_OK : SK_BUSY;
    freeReplyObject(reply);
    return rc;
}

int sk_lock_acquire_many(struct sk_lock *l, size_t n, const char *const *keys,
                         const char *const *tokens, uint32_t ttl_ms, int *rc,
                         struct sk_err *err)
{
    return sk_lock_swap_many(l, 0, n, keys, tokens, ttl_ms, 1, rc, err);
}

int sk_lock_swap_many(struct sk_lock *l, size_t n_release, size_t n, const char *const *keys,
                      const char *const *tokens, uint32_t ttl_ms, int limit, int *rc,
                      struct sk_err *err)
{
    return sk_lock_swap_riding(l, NULL, n_release, n, keys, tokens, ttl_ms, limit, rc, err);
}

/* One EVALSHA of swap_script over every key: one command, one round trip,
 * whatever the count; the ride's EVALSHA goes ahead of it in the same
 * write, and both replies are read before either is looked at, so that a
 * script Redis lost (NOSCRIPT: it ran nothing) can be loaded again on a
 * connection with nothing in flight; the swap is then sent again once,
 * the ride alone (ride_answer()). */
int sk_lock_swap_riding(struct sk_lock *l, struct sk_lock_ride *ride, size_t n_release,
                        size_t n, const char *const *keys, const char *const *tokens,
                        uint32_t ttl_ms, int limit, int *rc, struct sk_err *err)
{
    sk_assert(n_release <= n && limit >= 1);
    int status = ensure_connected(l, err);
    if (status == SK_OK && ride != NULL && ride->sha[0] == '\0')
        status = load_script(l, ride->script, ride->sha, err);
    if (status == SK_OK && n == 0) {  /* the ride alone */
        if (ride != NULL)
            ride->rc = sk_lock_eval(l, ride->script, ride->sha, ride->n_keys, ride->keys,
                                    ride->n_args, ride->args, ride->out, ride->n_out, &ride->err);
        return SK_OK;
    }
    if (status != SK_OK) {
        ride_answer(l, ride, NULL, status, err);
        return status;
    }
    redisReply *first = NULL;
    if (ride != NULL && (!put_eval(l, ride->sha, ride->n_keys, ride->keys, ride->n_args,
                                   ride->args) ||
                         sk_redis_link_append(l->ctx, l->cmd, l->cmd_len) != REDIS_OK)) {
        status = reply_error(l, NULL, "EVALSHA", err);
        ride_answer(l, ride, NULL, status, err);
        return status;
    }
    for (int attempt = 0;; attempt++) {
        redisReply *reply = NULL;
        if (put_swap(l, n_release, n, keys, tokens, ttl_ms, limit) &&
            sk_redis_link_append(l->ctx, l->cmd, l->cmd_len) == REDIS_OK &&
            (ride == NULL || attempt > 0 || sk_redis_link_reply(l->ctx, &first) == REDIS_OK) &&
            sk_redis_link_reply(l->ctx, &reply) != REDIS_OK)
            reply = NULL;
        status = script_trouble(l, reply, attempt, swap_script, l->swap_sha, "SET NX PX",
                                "the lock script runs (SET, GET, DEL)", err);
        if (status == SK_BUSY)
            continue;
        if (status == SK_OK && (reply == NULL || reply->type != REDIS_REPLY_ARRAY ||
                                reply->elements != n))
            status = reply_error(l, reply, "EVALSHA (lock)", err);
        else if (status == SK_OK) {
            for (size_t i = 0; i < n; i++) {
                const redisReply *e = reply->element[i];
                rc[i] = e->type == REDIS_REPLY_INTEGER && e->integer == 1 ? SK_OK : SK_BUSY;
            }
            freeReplyObject(reply);
        }
        ride_answer(l, ride, first, status, err);
        return status;
    }
}

/* The ride's answer, its reply read with the swap's (NULL: none), when the
 * swap ended in status: nothing to trust unless both were answered. A
 * script Redis lost ran nothing, and is asked alone once loaded again. */
static void ride_answer(struct sk_lock *l, struct sk_lock_ride *ride, redisReply *reply,
                        int status, const struct sk_err *err)
{
    if (ride == NULL)
        return;
    if (status != SK_OK) {
        if (reply != NULL)
            freeReplyObject(reply);
        ride->rc = SK_AGAIN;
        if (err != NULL && err != &ride->err)
            ride->err = *err;
        else if (err == NULL)
            sk_err_set(&ride->err, SK_AGAIN, "redis failed in the lock's round trip");
        return;
    }
    int rc = script_trouble(l, reply, 0, ride->script, ride->sha, "EVALSHA", "the script runs",
                            &ride->err);
    if (rc == SK_BUSY)
        rc = sk_lock_eval(l, ride->script, ride->sha, ride->n_keys, ride->keys, ride->n_args,
                          ride->args, ride->out, ride->n_out, &ride->err);
    else if (rc == SK_OK)
        rc = read_ints(l, reply, ride->out, ride->n_out, &ride->err);
    ride->rc = rc;
}

/* swap_script's EVALSHA in the command buffer; false out of memory. */
static bool put_swap(struct sk_lock *l, size_t n_release, size_t n, const char *const *keys,
                     const char *const *tokens, uint32_t ttl_ms, int limit)
{
    const char *ttl = ttl_text(l, ttl_ms);
    char n_keys[24], n_rel[24], lim[24];
    snprintf(n_keys, sizeof(n_keys), "%zu", n);
    snprintf(n_rel, sizeof(n_rel), "%zu", n_release);
    snprintf(lim, sizeof(lim), "%d", limit);
    size_t need = 40 + strlen(n_keys) + strlen(n_rel) + strlen(ttl) + strlen(lim) + 32;
    for (size_t i = 0; i < n; i++)
        need += strlen(keys[i]) + strlen(tokens[i]);
    if (!cmd_start(l, 6 + 2 * (int)n, need))
        return false;
    cmd_arg(l, "EVALSHA", 7);
    cmd_arg(l, l->swap_sha, 40);
    cmd_arg(l, n_keys, strlen(n_keys));
    for (size_t i = 0; i < n; i++)
        cmd_arg(l, keys[i], strlen(keys[i]));
    cmd_arg(l, n_rel, strlen(n_rel));
    cmd_arg(l, ttl, strlen(ttl));
    cmd_arg(l, lim, strlen(lim));
    for (size_t i = 0; i < n; i++)
        cmd_arg(l, tokens[i], strlen(tokens[i]));
    return true;
}

int sk_lock_release_many(struct sk_lock *l, size_t n, const char *const *keys,
                         const char *const *tokens, int *rc, struct sk_err *err)
{
    return script_many(l, release_script, l->release_sha, n, keys, tokens, NULL, rc, err);
}

int sk_lock_renew_many(struct sk_lock *l, size_t n, const char *const *keys,
                       const char *const *tokens, uint32_t ttl_ms, int *rc, struct sk_err *err)
{
    return script_many(l, renew_script, l->renew_sha, n, keys, tokens, ttl_text(l, ttl_ms), rc,
                       err);
}

/* One EVALSHA of the script per key, pipelined: n commands, one round trip.
 * A script Redis lost (NOSCRIPT) is loaded again by run_script(), and the
 * keys it failed for are tried one by one. */
static int script_many(struct sk_lock *l, const char *script, char sha[41], size_t n,
                       const char *const *keys, const char *const *tokens, const char *ttl,
                       int *rc, struct sk_err *err)
{
    int status = ensure_connected(l, err);
    if (status != SK_OK)
        return status;
    size_t ttl_len = ttl != NULL ? strlen(ttl) : 0;
    for (size_t i = 0; i < n; i++) {
        size_t key_len = strlen(keys[i]), token_len = strlen(tokens[i]);
        if (!cmd_start(l, ttl != NULL ? 6 : 5, 40 + key_len + token_len + ttl_len + 8))
            return reply_error(l, NULL, "EVALSHA", err);
        cmd_arg(l, "EVALSHA", 7);
        cmd_arg(l, sha, 40);
        cmd_arg(l, "1", 1);
        cmd_arg(l, keys[i], key_len);
        cmd_arg(l, tokens[i], token_len);
        if (ttl != NULL)
            cmd_arg(l, ttl, ttl_len);
        if (sk_redis_link_append(l->ctx, l->cmd, l->cmd_len) != REDIS_OK)
            return reply_error(l, NULL, "EVALSHA", err);
    }
    bool noscript = false;
    for (size_t i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (sk_redis_link_reply(l->ctx, &r) != REDIS_OK)
            return reply_error(l, NULL, "EVALSHA", err);
        if (r != NULL && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
            rc[i] = SK_AGAIN;
            noscript = true;
            freeReplyObject(r);
            continue;
        }
        if (r == NULL || r->type != REDIS_REPLY_INTEGER)
            return reply_error(l, r, "EVALSHA", err);
        rc[i] = r->integer == 1 ? SK_OK : SK_BUSY;
        freeReplyObject(r);
    }
    for (size_t i = 0; noscript && i < n; i++) {
        if (rc[i] != SK_AGAIN)
            continue;
        rc[i] = run_script(l, script, sha, keys[i], tokens[i], ttl, err);
        if (rc[i] == SK_AGAIN)
            return SK_AGAIN;
    }
    return SK_OK;
}

int sk_lock_renew(struct sk_lock *l, const char *key, const char *token, uint32_t ttl_ms,
                  struct sk_err *err)
{
    return run_script(l, renew_script, l->renew_sha, key, token, ttl_text(l, ttl_ms), err);
}

int sk_lock_release(struct sk_lock *l, const char *key, const char *token, struct sk_err *err)
{
    return run_script(l, release_script, l->release_sha, key, token, NULL, err);
}

/* Every job asks for the same TTL: its text is made once, not per call. */
static const char *ttl_text(struct sk_lock *l, uint32_t ttl_ms)
{
    if (l->ttl[0] == '\0' || l->ttl_ms != ttl_ms) {
        snprintf(l->ttl, sizeof(l->ttl), "%u", ttl_ms);
        l->ttl_ms = ttl_ms;
    }
    return l->ttl;
}

/* Starts a command of argc arguments whose bytes (with their headers)
 * fit in `need`. False only when memory for the buffer ran out. */
static bool cmd_start(struct sk_lock *l, int argc, size_t need)
{
    need += 32 * (size_t)(argc + 1);  /* "*N" and each "$len": CRLFs and digits */
    if (need > l->cmd_size) {
        char *grown = realloc(l->cmd, need);
        if (grown == NULL)
            return false;
        l->cmd = grown;
        l->cmd_size = need;
    }
    l->cmd_len = 0;
    l->cmd[l->cmd_len++] = '*';
    l->cmd_len += sk_format_u64(l->cmd + l->cmd_len, (size_t)argc);
    memcpy(l->cmd + l->cmd_len, "\r\n", 2);
    l->cmd_len += 2;
    return true;
}

/* One bulk string: "$<len>\r\n<bytes>\r\n". Keys may hold any byte. */
static void cmd_arg(struct sk_lock *l, const char *arg, size_t len)
{
    char *p = l->cmd + l->cmd_len;
    *p++ = '$';
    p += sk_format_u64(p, len);
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, arg, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    l->cmd_len = (size_t)(p - l->cmd);
}

/* Sends the command built and waits for its reply: NULL when the
 * connection failed (its errstr says why). */
static redisReply *cmd_send(struct sk_lock *l)
{
    redisReply *reply = NULL;
    if (sk_redis_link_append(l->ctx, l->cmd, l->cmd_len) != REDIS_OK ||
        sk_redis_link_reply(l->ctx, &reply) != REDIS_OK)
        return NULL;
    return reply;
}

static int ensure_connected(struct sk_lock *l, struct sk_err *err)
{
    if (l->ctx != NULL)
        return SK_OK;
    if (l->conf->n_sentinels > 0)
        return connect_master(l, err);
    return connect_server(l, l->conf->host, l->conf->port, err);
}

/* Connects to host:port, logs in and loads the scripts. On failure l->ctx
 * is NULL again. Commands get the same bound as the connect (the link's
 * timeout): a stalled Redis must turn into SK_AGAIN, never into a worker
 * stuck holding a delivery. */
static int connect_server(struct sk_lock *l, const char *host, int port, struct sk_err *err)
{
    int rc = sk_redis_link_open(&l->ctx, host, port, &l->conf->tls, l->timeout_ms, err);
    if (rc != SK_OK)
        return rc;
    if (l->conf->password != NULL && (rc = log_in(l->ctx, l->conf->username,
                                                  l->conf->password, err)) != SK_OK) {
        disconnect(l);
        return rc;
    }
    return load_scripts(l, err);
}

/* SELECT and the three SCRIPT LOADs, sent at once and answered in one round
 * trip: a worker connecting to a far Redis (or its replacement after a
 * crash) pays one round trip here, not four. Every reply is read, so the
 * connection stays in step whichever failed; the first failure is the one
 * reported. */
static int load_scripts(struct sk_lock *l, struct sk_err *err)
{
    struct {
        const char *script;
        char       *sha;
    } const loads[] = {
        { renew_script, l->renew_sha },
        { release_script, l->release_sha },
        { swap_script, l->swap_sha },
    };
    bool select = l->conf->db != 0;
    char db[16];
    snprintf(db, sizeof(db), "%d", l->conf->db);
    const char *select_argv[] = { "SELECT", db };
    if (select && !append_argv(l, 2, select_argv))
        return reply_error(l, NULL, "SELECT", err);
    for (size_t i = 0; i < SK_ARRAY_LEN(loads); i++) {
        const char *argv[] = { "SCRIPT", "LOAD", loads[i].script };
        if (!append_argv(l, 3, argv))
            return reply_error(l, NULL, "SCRIPT LOAD", err);
    }
    int rc = SK_OK;
    const char *failed = NULL;
    redisReply *bad = NULL;
    size_t n = SK_ARRAY_LEN(loads) + (select ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        redisReply *reply = NULL;
        if (sk_redis_link_reply(l->ctx, &reply) != REDIS_OK) {
            if (bad != NULL)
                freeReplyObject(bad);
            return reply_error(l, NULL, "SCRIPT LOAD", err);
        }
        bool is_select = select && i == 0;
        size_t k = i - (select ? 1 : 0);
        bool ok = is_select ? reply->type != REDIS_REPLY_ERROR
                            : reply->type == REDIS_REPLY_STRING && reply->len == 40;
        if (ok && !is_select)
            memcpy(loads[k].sha, reply->str, 41);
        if (!ok && bad == NULL) {
            bad = reply;
            failed = is_select ? "SELECT" : "SCRIPT LOAD";
            rc = SK_AGAIN;
            continue;
        }
        freeReplyObject(reply);
    }
    if (rc != SK_OK)
        return reply_error(l, bad, failed, err);
    return SK_OK;
}

/* Queues one command of argc string arguments on the link, for a reply read
 * later. False when out of memory. */
static bool append_argv(struct sk_lock *l, int argc, const char **argv)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, NULL);
    if (len < 0)
        return false;
    bool ok = sk_redis_link_append(l->ctx, cmd, (size_t)len) == REDIS_OK;
    redisFreeCommand(cmd);
    return ok;
}

/* AUTH [user] password. A refusal is marked SK_AUTH (a wrong password must
 * say so, and at start exit 2); the message names the user, never the
 * password. */
static int log_in(struct sk_redis_link *ctx, const char *user, const char *password,
                  struct sk_err *err)
{
    redisReply *reply = user != NULL ? sk_redis_link_command(ctx, "AUTH %s %s", user, password)
                                     : sk_redis_link_command(ctx, "AUTH %s", password);
    if (reply != NULL && reply->type != REDIS_REPLY_ERROR) {
        freeReplyObject(reply);
        return SK_OK;
    }
    sk_err_set(err, SK_AGAIN, "redis AUTH%s%s at %s:%d failed: %s", user != NULL ? " as " : "",
               user != NULL ? user : "", sk_redis_link_host(ctx), sk_redis_link_port(ctx),
               reply != NULL ? reply->str : sk_redis_link_errstr(ctx));
    if (reply != NULL && refused_login(reply->str))
        sk_err_mark_auth(err, SK_AGAIN);
    else if (reply == NULL && sk_redis_link_setting(ctx) && err != NULL)
        err->code = SK_SETTING;
    if (reply != NULL)
        freeReplyObject(reply);
    return SK_AGAIN;
}

/* Asks each sentinel in turn, starting with the one that answered last, and
 * connects to the first master named that says it is one. A sentinel that is
 * down, does not know the name, or names a server that is not a master, is
 * passed over; the error returned is the last one met. */
static int connect_master(struct sk_lock *l, struct sk_err *err)
{
    const struct sk_redis_conf *c = l->conf;
    char host[256];
    int port, rc = SK_AGAIN;

    for (size_t n = 0; n < c->n_sentinels; n++) {
        size_t i = (l->sentinel + n) % c->n_sentinels;
        rc = ask_sentinel(l, &c->sentinels[i], host, sizeof(host), &port, err);
        if (rc == SK_OK)
            rc = connect_server(l, host, port, err);
        if (rc == SK_OK)
            rc = check_master(l, err);
        if (rc == SK_OK) {
            l->sentinel = i;
            return SK_OK;
        }
    }
    return rc;
}

/* SENTINEL get-master-addr-by-name: the sentinel's view of where the master
 * is, a two-element array (host, port), or nil for a name it does not
 * monitor. Uses a connection of its own, closed before returning. */
static int ask_sentinel(const struct sk_lock *l, const struct sk_addr *s, char *host,
                        size_t host_len, int *port, struct sk_err *err)
{
    const char *name = l->conf->master_name;
    struct sk_redis_link *ctx = NULL;
    redisReply *reply = NULL;
    struct sk_err why = { 0 };
    int rc = SK_AGAIN;

    if (sk_redis_link_open(&ctx, s->host, s->port, &l->conf->tls, l->conf->timeout_ms,
                           &why) != SK_OK) {
        sk_err_set(err, SK_AGAIN, "sentinel: %s", why.msg);
        goto keep_code;
    }
    if (l->conf->sentinel_password != NULL &&
        log_in(ctx, l->conf->sentinel_username, l->conf->sentinel_password, &why) != SK_OK) {
        sk_err_set(err, SK_AGAIN, "sentinel: %s", why.msg);
        goto keep_code;
    }
    reply = sk_redis_link_command(ctx, "SENTINEL get-master-addr-by-name %s", name);
    if (reply == NULL) {
        sk_err_set(err, SK_AGAIN, "sentinel %s:%d: get-master-addr-by-name failed: %s",
                   s->host, s->port, sk_redis_link_errstr(ctx));
    } else if (reply->type == REDIS_REPLY_NIL) {
        sk_err_set(err, SK_AGAIN, "sentinel %s:%d does not monitor a master named \"%s\"",
                   s->host, s->port, name);
    } else if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
               reply->element[0]->type != REDIS_REPLY_STRING ||
               reply->element[1]->type != REDIS_REPLY_STRING) {
        sk_err_set(err, SK_AGAIN, "sentinel %s:%d: get-master-addr-by-name %s: %s", s->host,
                   s->port, name, reply->type == REDIS_REPLY_ERROR ? reply->str
                   : "unexpected reply (not a sentinel?)");
    } else {
        char *end;
        long p = strtol(reply->element[1]->str, &end, 10);
        if (reply->element[0]->len == 0 || reply->element[0]->len >= host_len || *end != '\0' ||
            end == reply->element[1]->str || p < 1 || p > 65535) {
            sk_err_set(err, SK_AGAIN, "sentinel %s:%d named master \"%s\" at an invalid "
                       "address", s->host, s->port, name);
        } else {
            memcpy(host, reply->element[0]->str, reply->element[0]->len + 1);
            *port = (int)p;
            rc = SK_OK;
        }
    }
    goto done;
keep_code:  /* a refusal (SK_AUTH, SK_SETTING) says what to do about it */
    if (err != NULL)
        err->code = why.code;
done:
    if (reply != NULL)
        freeReplyObject(reply);
    sk_redis_link_close(ctx);
    return rc;
}

/* ROLE's first element is "master" only on a master. A sentinel's answer can
 * be stale (it has not yet heard of a failover, or is partitioned from the
 * others), and a lock taken on a replica would fail only at the next write. */
static int check_master(struct sk_lock *l, struct sk_err *err)
{
    redisReply *reply = sk_redis_link_command(l->ctx, "ROLE");
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements == 0 ||
        reply->element[0]->type != REDIS_REPLY_STRING)
        return reply_error(l, reply, "ROLE", err);
    if (strcmp(reply->element[0]->str, "master") != 0) {
        sk_err_set(err, SK_AGAIN, "redis %s:%d, named master \"%s\" by a sentinel, is a %s",
                   sk_redis_link_host(l->ctx), sk_redis_link_port(l->ctx), l->conf->master_name,
                   reply->element[0]->str);
        freeReplyObject(reply);
        disconnect(l);
        return SK_AGAIN;
    }
    freeReplyObject(reply);
    return SK_OK;
}

uint64_t sk_lock_rtt_ns(const struct sk_lock *l)
{
    return l != NULL && l->ctx != NULL ? sk_redis_link_rtt_ns(l->ctx) : 0;
}

void sk_lock_set_timeout(struct sk_lock *l, uint32_t timeout_ms)
{
    l->timeout_ms = timeout_ms > 0 ? timeout_ms : l->conf->timeout_ms;
    if (l->ctx != NULL && sk_redis_link_set_timeout(l->ctx, l->timeout_ms) != SK_OK)
        disconnect(l);  /* its old bound may be too long: the next call reconnects */
}

static void disconnect(struct sk_lock *l)
{
    sk_redis_link_close(l->ctx);
    l->ctx = NULL;
}

int sk_lock_eval(struct sk_lock *l, const char *script, char sha[41], size_t n_keys,
                 const char *const *keys, size_t n_args, const char *const *args,
                 long long *out, size_t n_out, struct sk_err *err)
{
    int rc = ensure_connected(l, err);
    if (rc == SK_OK && sha[0] == '\0')
        rc = load_script(l, script, sha, err);
    if (rc != SK_OK)
        return rc;
    for (int attempt = 0;; attempt++) {
        redisReply *reply = NULL;
        if (put_eval(l, sha, n_keys, keys, n_args, args))
            reply = cmd_send(l);
        rc = script_trouble(l, reply, attempt, script, sha, "EVALSHA", "the script runs", err);
        if (rc == SK_BUSY)
            continue;
        return rc != SK_OK ? rc : read_ints(l, reply, out, n_out, err);
    }
}

/* An EVALSHA of sha in the command buffer; false out of memory. */
static bool put_eval(struct sk_lock *l, const char *sha, size_t n_keys, const char *const *keys,
                     size_t n_args, const char *const *args)
{
    char count[24];
    snprintf(count, sizeof(count), "%zu", n_keys);
    size_t need = 64;
    for (size_t i = 0; i < n_keys; i++)
        need += strlen(keys[i]);
    for (size_t i = 0; i < n_args; i++)
        need += strlen(args[i]);
    if (!cmd_start(l, 3 + (int)(n_keys + n_args), need))
        return false;
    cmd_arg(l, "EVALSHA", 7);
    cmd_arg(l, sha, 40);
    cmd_arg(l, count, strlen(count));
    for (size_t i = 0; i < n_keys; i++)
        cmd_arg(l, keys[i], strlen(keys[i]));
    for (size_t i = 0; i < n_args; i++)
        cmd_arg(l, args[i], strlen(args[i]));
    return true;
}

/* A script's reply of n_out integers into out[], freed; else SK_AGAIN and
 * the connection dropped (reply_error()). */
static int read_ints(struct sk_lock *l, redisReply *reply, long long *out, size_t n_out,
                     struct sk_err *err)
{
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements != n_out)
        return reply_error(l, reply, "EVALSHA", err);
    for (size_t i = 0; i < n_out; i++) {
        const redisReply *e = reply->element[i];
        if (e->type != REDIS_REPLY_INTEGER)
            return reply_error(l, reply, "EVALSHA (not an integer)", err);
        out[i] = e->integer;
    }
    freeReplyObject(reply);
    return SK_OK;
}

static int load_script(struct sk_lock *l, const char *script, char sha[41], struct sk_err *err)
{
    redisReply *reply = sk_redis_link_command(l->ctx, "SCRIPT LOAD %s", script);
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
        size_t key_len = strlen(key), token_len = strlen(token);
        size_t ttl_len = ttl != NULL ? strlen(ttl) : 0;
        redisReply *reply = NULL;
        if (cmd_start(l, ttl != NULL ? 6 : 5, 40 + key_len + token_len + ttl_len + 8)) {
            cmd_arg(l, "EVALSHA", 7);
            cmd_arg(l, sha, 40);
            cmd_arg(l, "1", 1);
            cmd_arg(l, key, key_len);
            cmd_arg(l, token, token_len);
            if (ttl != NULL)
                cmd_arg(l, ttl, ttl_len);
            reply = cmd_send(l);
        }
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
 * ... called without any password configured": we give one it does not have;
 * NOPERM: our ACL user may not run a command sekali needs, as much a
 * configuration error as a wrong password (and going on without locks would
 * hide it). */
static bool refused_login(const char *reply)
{
    return strncmp(reply, "NOAUTH", 6) == 0 || strncmp(reply, "WRONGPASS", 9) == 0 ||
           strncmp(reply, "NOPERM", 6) == 0 ||
           strncmp(reply, "ERR invalid password", 20) == 0 ||
           strncmp(reply, "ERR AUTH", 8) == 0;
}

/* A command the script ran was refused by the ACL: NOPERM in the reply
 * (Redis 6), Redis 7's "The user executing the script can't run this
 * command", or Valkey 8's "ACL failure in script: User ... has no
 * permissions to run the 'set' command" (which, unmatched, was taken for
 * an outage and, under on_redis_down: proceed, turned the locks off). */
static bool script_refused(const char *reply)
{
    return strstr(reply, "NOPERM") != NULL ||
           strstr(reply, "user executing the script can't run") != NULL ||
           strstr(reply, "ACL failure in script") != NULL;
}

/* What a script's reply may say before its answer: NOSCRIPT on the first
 * attempt (Redis lost the script and ran nothing: loaded again, SK_BUSY
 * asks the caller to send it again), or an ACL refusal inside the script
 * (SK_AGAIN, marked as a login's: Redis 7 words it as ERR, not NOPERM).
 * SK_OK: neither, the reply is the caller's to read. Else the reply is
 * freed. */
static int script_trouble(struct sk_lock *l, redisReply *reply, int attempt, const char *script,
                          char sha[41], const char *what, const char *runs, struct sk_err *err)
{
    if (reply == NULL || reply->type != REDIS_REPLY_ERROR)
        return SK_OK;
    if (attempt == 0 && strncmp(reply->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(reply);
        int rc = load_script(l, script, sha, err);
        return rc == SK_OK ? SK_BUSY : rc;
    }
    if (!script_refused(reply->str))
        return SK_OK;
    sk_err_set(err, SK_AGAIN, "redis %s failed: NOPERM: the ACL user may not run what %s: %s",
               what, runs, reply->str);
    sk_err_mark_auth(err, SK_AGAIN);
    freeReplyObject(reply);
    disconnect(l);
    return SK_AGAIN;
}

/* Any failure drops the connection: after a timeout hiredis may still have a
 * reply in flight, and reading it as the answer to the next command would
 * attribute one key's answer to another. */
static int reply_error(struct sk_lock *l, redisReply *reply, const char *what,
                       struct sk_err *err)
{
    if (reply == NULL) {
        sk_err_set(err, SK_AGAIN, "redis %s failed: %s", what,
                   l->ctx == NULL                          ? "not connected"
                   : *sk_redis_link_errstr(l->ctx) != '\0' ? sk_redis_link_errstr(l->ctx)
                                                           : "out of memory for the command");
        if (l->ctx != NULL && sk_redis_link_setting(l->ctx) && err != NULL)
            err->code = SK_SETTING;
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
