/* lock.h - a lease lock in Redis with an owner token (hiredis).
 *
 * The lock only makes concurrent work on one resource rare; it never decides
 * whether a job's effect happens (PostgreSQL does). Expiry is Redis's: we pass
 * a TTL and never compare clocks. Renewal and release are compare-by-token
 * scripts, so a worker whose lease expired cannot extend or delete the lock a
 * newer owner holds. A key may also be a semaphore (a queue's concurrency):
 * renewal and release work on either kind. One struct sk_lock is one connection, owned by one thread. */
#ifndef SK_LOCK_H
#define SK_LOCK_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "tls.h"

#define SK_LOCK_TOKEN_LEN 32  /* hex characters of a random owner token */
#define SK_LOCK_KEY_MAX (SK_KEY_MAX + 300)  /* "sekali:lock:<queue>:<resource>" and NUL */

struct sk_lock;

/* One host:port, as written in a list of servers. */
struct sk_addr {
    char *host;
    int   port;
};

struct sk_redis_conf {
    char    *host;                 /* unused when sentinels are given */
    int      port;
    int      db;
    char    *username;             /* redis.username: AUTH as this ACL user; NULL: default */
    char    *password;             /* NULL: no AUTH (the master's, not the sentinels') */
    struct sk_tls_conf tls;        /* redis.tls: the master's and the sentinels' links */
    uint32_t timeout_ms;           /* connect and command timeout, sentinels' too */
    struct sk_addr *sentinels;     /* asked in turn for master_name's address; */
    size_t   n_sentinels;          /* 0: connect to host:port directly */
    char    *master_name;          /* set exactly when n_sentinels > 0 */
    char    *sentinel_username;    /* the sentinels' own ACL user and password; */
    char    *sentinel_password;    /* NULL: no AUTH to them */
};

/* Connects and loads the scripts. Returns SK_OK, or SK_AGAIN if Redis is
 * unreachable or refused AUTH/SELECT (transient from our side: back off). */
int  sk_lock_open(struct sk_lock **out, const struct sk_redis_conf *conf, struct sk_err *err);
/* sk_lock_open() with its own bound on connecting and on each command
 * (timeout_ms; 0: conf->timeout_ms), kept across reconnects: the renewal
 * thread's, sized from the lock's TTL rather than from redis.timeout. */
int  sk_lock_open_bounded(struct sk_lock **out, const struct sk_redis_conf *conf,
                          uint32_t timeout_ms, struct sk_err *err);
void sk_lock_close(struct sk_lock *l);
/* Redis's round trip as this connection measures it (the least of its
 * last 8), in ns; 0 before the first, or while it is not connected. */
uint64_t sk_lock_rtt_ns(const struct sk_lock *l);
/* Changes the bound sk_lock_open_bounded() gave: the live connection's
 * reads and writes at once, a reconnect's connect too. The renewal thread
 * narrows it to what is left of the lease it is saving. */
void sk_lock_set_timeout(struct sk_lock *l, uint32_t timeout_ms);

/* Writes the Redis key that locks `resource` in `queue` into out:
 * "sekali:lock:<queue>:<resource>". The namespace is an interface: the
 * scoreboard carries these keys from a dead worker to its replacement, and
 * operators (and the tests) look locks up by it. Truncates to size. */
void sk_lock_key(char *out, size_t size, const char *queue, const char *resource);

/* Writes a fresh random owner token of SK_LOCK_TOKEN_LEN hex chars plus NUL. */
void sk_lock_new_token(char token[SK_LOCK_TOKEN_LEN + 1]);

/* SET key token NX PX ttl. Returns SK_OK (ours now), SK_BUSY (another owner)
 * or SK_AGAIN (Redis unreachable: the connection is dropped and reopened on
 * the next call). Blocks at most the configured command timeout. */
int sk_lock_acquire(struct sk_lock *l, const char *key, const char *token, uint32_t ttl_ms,
                    struct sk_err *err);

/* sk_lock_acquire() of n keys in one round trip (sk_lock_swap_many()
 * releasing none): rc[i] is
 * SK_OK or SK_BUSY for each. Returns SK_OK, or SK_AGAIN when Redis failed
 * (then no rc[i] is to be trusted: a lock may have been taken, and will
 * expire). */
int sk_lock_acquire_many(struct sk_lock *l, size_t n, const char *const *keys,
                         const char *const *tokens, uint32_t ttl_ms, int *rc,
                         struct sk_err *err);

/* Releases the first n_release of keys (if tokens[i] still owns keys[i])
 * and then takes the others (SET NX PX ttl_ms; with limit above 1, a
 * permit of a semaphore admitting that many holders, each with its own
 * ttl_ms on Redis's clock), in one script: one command
 * and one round trip for both, so that a worker's releases travel with its
 * next acquire. rc[i] is SK_OK (released, or ours now) or SK_BUSY (not ours
 * any more, or another owner's). Returns SK_OK, or SK_AGAIN when Redis
 * failed (no rc[i] to be trusted: a release may not have happened, and the
 * lock expires; a lock may have been taken, and expires too). */
int sk_lock_swap_many(struct sk_lock *l, size_t n_release, size_t n, const char *const *keys,
                      const char *const *tokens, uint32_t ttl_ms, int limit, int *rc,
                      struct sk_err *err);

/* Another module's script, sent ahead of a swap in the same write and
 * answered with it (sk_lock_swap_riding()): the rate limit asks its keys
 * in the round trip that takes the batch's locks. The caller fills the
 * fields above rc, as sk_lock_eval() takes them, and keeps them alive
 * through the call. */
struct sk_lock_ride {
    const char        *script;
    char              *sha;         /* 41 bytes: "" until known */
    size_t             n_keys, n_args, n_out;
    const char *const *keys;
    const char *const *args;
    long long         *out;
    int                rc;          /* SK_OK: out[] holds the answers; else nothing to trust */
    struct sk_err      err;         /* why not, when rc is not SK_OK */
};

/* sk_lock_swap_many() with ride's script (none when NULL) in the same
 * write: one round trip for both. Returns the swap's status; ride->rc is
 * SK_OK with ride->out filled, or SK_AGAIN with ride->err saying why
 * (always when the swap failed, since neither was read then; alone, when
 * the ride's script failed and the connection was dropped). A ride whose
 * script Redis lost costs a round trip of its own after the swap's. With
 * n 0 the ride goes alone (keys, tokens and rc unused). */
int sk_lock_swap_riding(struct sk_lock *l, struct sk_lock_ride *ride, size_t n_release,
                        size_t n, const char *const *keys, const char *const *tokens,
                        uint32_t ttl_ms, int limit, int *rc, struct sk_err *err);

/* sk_lock_release() of n keys in one round trip. Returns SK_OK when each
 * was answered (rc[i]: SK_OK, or SK_BUSY: not ours any more), or SK_AGAIN. */
int sk_lock_release_many(struct sk_lock *l, size_t n, const char *const *keys,
                         const char *const *tokens, int *rc, struct sk_err *err);

/* sk_lock_renew() of n keys in one round trip (pipelined), as
 * sk_lock_release_many(): SK_OK when each was answered (rc[i]: SK_OK, or
 * SK_BUSY: lost), or SK_AGAIN (then no rc[i] is to be trusted). */
int sk_lock_renew_many(struct sk_lock *l, size_t n, const char *const *keys,
                       const char *const *tokens, uint32_t ttl_ms, int *rc, struct sk_err *err);

/* Extends the lease to ttl_ms if token still owns key. SK_OK, SK_BUSY (lost:
 * expired or taken), or SK_AGAIN. */
int sk_lock_renew(struct sk_lock *l, const char *key, const char *token, uint32_t ttl_ms,
                  struct sk_err *err);

/* Deletes key if token still owns it. SK_OK, SK_BUSY (not ours any more), or
 * SK_AGAIN. */
int sk_lock_release(struct sk_lock *l, const char *key, const char *token, struct sk_err *err);

/* Runs `script` (whose SHA1 the caller keeps in sha, "" until known: the
 * script is loaded then, and again if Redis lost it) over n_keys keys and
 * n_args arguments, on this connection, in one round trip; for another
 * module's script (rate.c), so that it shares the lock's connection and its
 * failover. The reply must be an array of n_out integers, into out[].
 * SK_OK, or SK_AGAIN (Redis failed or refused: nothing in out[] to trust;
 * an ACL refusal is marked as a login's). Main thread only, as the lock. */
int sk_lock_eval(struct sk_lock *l, const char *script, char sha[41], size_t n_keys,
                 const char *const *keys, size_t n_args, const char *const *args,
                 long long *out, size_t n_out, struct sk_err *err);

#endif
