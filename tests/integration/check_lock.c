/* check_lock.c - the Redis lease lock against a real Redis: the commands
 * lock.c writes by hand in the wire protocol, and its owner tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"
#include "lock.h"

static struct sk_redis_conf redis_conf(void)
{
    h_init();
    return (struct sk_redis_conf){ .host = "127.0.0.1", .port = h_redis_port(),
                                   .timeout_ms = 5000 };
}

static long long redis_pttl(const char *key)
{
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    redisReply *reply = redisCommand(redis, "PTTL %b", key, strlen(key));
    ck_assert_ptr_nonnull(reply);
    ck_assert_int_eq(reply->type, REDIS_REPLY_INTEGER);
    long long ttl = reply->integer;
    freeReplyObject(reply);
    redisFree(redis);
    return ttl;
}

/* Three lock names of one test and a token for each, and two connections. */
struct three {
    char        keys[3][64];
    char        tokens[3][SK_LOCK_TOKEN_LEN + 1];
    const char *key_list[3], *token_list[3];
};

static void three_locks(struct three *t, const char *name, struct sk_lock **a,
                        struct sk_lock **b)
{
    struct sk_redis_conf conf = redis_conf();
    static struct sk_redis_conf kept;  /* outlives the connections, as sk_lock_open() wants */
    kept = conf;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_lock_open(a, &kept, &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(sk_lock_open(b, &kept, &err) == SK_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        snprintf(t->keys[i], sizeof(t->keys[i]), "sekali:lock:%s-%d:%d", name, (int)getpid(), i);
        sk_lock_new_token(t->tokens[i]);
        t->key_list[i] = t->keys[i];
        t->token_list[i] = t->tokens[i];
    }
}

/* A resource key is the producer's: spaces, CR LF and a '$' or '*' that
 * look like protocol must stay bytes of one argument, not split a command. */
START_TEST(test_lock_keys_with_protocol_characters_stay_one_argument)
{
    struct sk_redis_conf conf = redis_conf();
    struct sk_lock *a, *b;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_lock_open(&a, &conf, &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(sk_lock_open(&b, &conf, &err) == SK_OK, "%s", err.msg);
    char key[600];
    int n = snprintf(key, sizeof(key), "sekali:lock:test:%d a b\r\n*3\r\n$3\r\nDEL ", getpid());
    memset(key + n, 'k', sizeof(key) - (size_t)n - 1);  /* longer than any first buffer */
    key[sizeof(key) - 1] = '\0';
    char mine[SK_LOCK_TOKEN_LEN + 1], theirs[SK_LOCK_TOKEN_LEN + 1];
    sk_lock_new_token(mine);
    sk_lock_new_token(theirs);

    ck_assert_msg(sk_lock_acquire(a, key, mine, 60000, &err) == SK_OK, "%s", err.msg);
    ck_assert(h_redis_exists(key));
    long long ttl = redis_pttl(key);
    ck_assert_msg(ttl > 50000 && ttl <= 60000, "PX not applied: pttl %lld", ttl);
    ck_assert_int_eq(sk_lock_acquire(b, key, theirs, 60000, &err), SK_BUSY);
    ck_assert_int_eq(sk_lock_renew(b, key, theirs, 90000, &err), SK_BUSY);
    ck_assert_int_eq(sk_lock_release(b, key, theirs, &err), SK_BUSY);
    ck_assert(h_redis_exists(key));

    ck_assert_msg(sk_lock_renew(a, key, mine, 90000, &err) == SK_OK, "%s", err.msg);
    ttl = redis_pttl(key);
    ck_assert_msg(ttl > 60000 && ttl <= 90000, "renew did not extend: pttl %lld", ttl);
    ck_assert_msg(sk_lock_release(a, key, mine, &err) == SK_OK, "%s", err.msg);
    ck_assert(!h_redis_exists(key));
    ck_assert_msg(sk_lock_acquire(b, key, theirs, 60000, &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(sk_lock_release(b, key, theirs, &err) == SK_OK, "%s", err.msg);
    sk_lock_close(a);
    sk_lock_close(b);
}
END_TEST

/* After SCRIPT FLUSH the next renew and release load the scripts again. */
START_TEST(test_lock_scripts_flushed_by_redis_are_loaded_again)
{
    struct sk_redis_conf conf = redis_conf();
    struct sk_lock *l;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_lock_open(&l, &conf, &err) == SK_OK, "%s", err.msg);
    char key[64], token[SK_LOCK_TOKEN_LEN + 1];
    snprintf(key, sizeof(key), "sekali:lock:test:flush-%d", getpid());
    sk_lock_new_token(token);
    ck_assert_msg(sk_lock_acquire(l, key, token, 60000, &err) == SK_OK, "%s", err.msg);

    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    freeReplyObject(redisCommand(redis, "SCRIPT FLUSH"));
    redisFree(redis);

    ck_assert_msg(sk_lock_renew(l, key, token, 60000, &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(sk_lock_release(l, key, token, &err) == SK_OK, "%s", err.msg);
    ck_assert(!h_redis_exists(key));
    sk_lock_close(l);
}
END_TEST

/* Tokens come from a per-process random prefix and a counter: a child
 * forked after its parent made tokens must not repeat the parent's
 * sequence, or two workers could own each other's locks. */
START_TEST(test_lock_tokens_are_unique_and_a_forked_child_draws_its_own)
{
    enum { N = 1000 };
    static char tokens[N][SK_LOCK_TOKEN_LEN + 1];
    for (int i = 0; i < N; i++) {
        sk_lock_new_token(tokens[i]);
        ck_assert_uint_eq(strlen(tokens[i]), SK_LOCK_TOKEN_LEN);
        ck_assert_uint_eq(strspn(tokens[i], "0123456789abcdef"), SK_LOCK_TOKEN_LEN);
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(tokens[i], tokens[j]);
    }
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char child[SK_LOCK_TOKEN_LEN + 1];
        sk_lock_new_token(child);
        _exit(write(fds[1], child, sizeof(child)) == (ssize_t)sizeof(child) ? 0 : 1);
    }
    char child[SK_LOCK_TOKEN_LEN + 1], next[SK_LOCK_TOKEN_LEN + 1];
    ck_assert_int_eq(read(fds[0], child, sizeof(child)), (ssize_t)sizeof(child));
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(fds[0]);
    close(fds[1]);
    sk_lock_new_token(next);
    ck_assert_str_ne(child, next);
    /* Not just another counter value: the child's whole prefix is its own. */
    ck_assert_msg(strncmp(child, next, SK_LOCK_TOKEN_LEN / 2) != 0,
                  "child %s shares its parent's prefix (%s)", child, next);
}
END_TEST

/* One pipelined round trip answers for each key on its own: a key someone
 * else holds is busy, the others are ours; releasing them all frees only
 * ours and leaves the other owner's lock in place. */
START_TEST(test_pipelined_acquire_and_release_answer_for_each_key)
{
    struct sk_lock *a, *b;
    struct sk_err err = { 0 };
    struct three t;
    three_locks(&t, "many", &a, &b);
    char (*keys)[64] = t.keys;
    const char **key_list = t.key_list, **token_list = t.token_list;
    char theirs[SK_LOCK_TOKEN_LEN + 1];
    sk_lock_new_token(theirs);
    ck_assert_int_eq(sk_lock_acquire(b, keys[1], theirs, 60000, &err), SK_OK);

    int rc[3];
    ck_assert_msg(sk_lock_acquire_many(a, 3, key_list, token_list, 60000, rc, &err) == SK_OK,
                  "%s", err.msg);
    ck_assert_int_eq(rc[0], SK_OK);
    ck_assert_int_eq(rc[1], SK_BUSY);
    ck_assert_int_eq(rc[2], SK_OK);
    ck_assert_msg(redis_pttl(keys[0]) > 50000, "key 0 should hold a 60 s lease");

    ck_assert_msg(sk_lock_release_many(a, 3, key_list, token_list, rc, &err) == SK_OK,
                  "%s", err.msg);
    ck_assert_int_eq(rc[0], SK_OK);
    ck_assert_int_eq(rc[1], SK_BUSY);
    ck_assert_int_eq(rc[2], SK_OK);
    ck_assert_int_eq(redis_pttl(keys[0]), -2);  /* gone */
    ck_assert_int_gt(redis_pttl(keys[1]), 0);   /* the other owner's, untouched */
    ck_assert_int_eq(redis_pttl(keys[2]), -2);
    ck_assert_int_eq(sk_lock_release(b, keys[1], theirs, &err), SK_OK);
    sk_lock_close(a);
    sk_lock_close(b);
}
END_TEST

/* A release travelling with the next acquire (sk_lock_swap_many()): in one
 * script, the lock ours is released and taken again by the next job's
 * token, the one another owner took over is spared, and a free key is
 * taken; after SCRIPT FLUSH the script is loaded again. */
START_TEST(test_swap_releases_ours_before_it_takes_the_next)
{
    struct sk_lock *a, *b;
    struct sk_err err = { 0 };
    struct three t;
    three_locks(&t, "swap", &a, &b);
    char (*keys)[64] = t.keys;
    char theirs[SK_LOCK_TOKEN_LEN + 1], old0[SK_LOCK_TOKEN_LEN + 1];
    snprintf(old0, sizeof(old0), "%s", t.token_list[0]);
    int rc[4];
    ck_assert_msg(sk_lock_acquire_many(a, 2, t.key_list, t.token_list, 60000, rc, &err) ==
                  SK_OK, "%s", err.msg);
    ck_assert_int_eq(rc[0], SK_OK);
    ck_assert_int_eq(rc[1], SK_OK);
    /* Key 1's lease is taken over by another owner while "ours". */
    sk_lock_new_token(theirs);
    ck_assert_int_eq(sk_lock_release(a, keys[1], t.token_list[1], &err), SK_OK);
    ck_assert_int_eq(sk_lock_acquire(b, keys[1], theirs, 60000, &err), SK_OK);

    char next0[SK_LOCK_TOKEN_LEN + 1];
    sk_lock_new_token(next0);
    const char *k[4] = { keys[0], keys[1], keys[0], keys[2] };
    const char *tok[4] = { old0, t.token_list[1], next0, t.token_list[2] };
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    freeReplyObject(redisCommand(redis, "SCRIPT FLUSH"));
    ck_assert_msg(sk_lock_swap_many(a, 2, 4, k, tok, 60000, 1, rc, &err) == SK_OK, "%s", err.msg);
    ck_assert_int_eq(rc[0], SK_OK);    /* released ... */
    ck_assert_int_eq(rc[1], SK_BUSY);  /* not ours any more: spared */
    ck_assert_int_eq(rc[2], SK_OK);    /* ... and taken by the next job */
    ck_assert_int_eq(rc[3], SK_OK);
    redisReply *owner = redisCommand(redis, "GET %s", keys[0]);
    ck_assert_msg(owner != NULL && owner->type == REDIS_REPLY_STRING &&
                  strcmp(owner->str, next0) == 0, "key 0 should be the next job's");
    freeReplyObject(owner);
    owner = redisCommand(redis, "GET %s", keys[1]);
    ck_assert_msg(owner != NULL && owner->type == REDIS_REPLY_STRING &&
                  strcmp(owner->str, theirs) == 0, "key 1 should still be the other owner's");
    freeReplyObject(owner);
    ck_assert_msg(redis_pttl(keys[2]) > 50000, "key 2 should hold a 60 s lease");
    redisFree(redis);
    /* Releasing only, as an idle worker does. */
    const char *mine[2] = { keys[0], keys[2] };
    const char *mine_tok[2] = { next0, t.token_list[2] };
    ck_assert_msg(sk_lock_swap_many(a, 2, 2, mine, mine_tok, 60000, 1, rc, &err) == SK_OK, "%s",
                  err.msg);
    ck_assert_int_eq(rc[0], SK_OK);
    ck_assert_int_eq(rc[1], SK_OK);
    ck_assert_int_eq(redis_pttl(keys[0]), -2);
    ck_assert_int_eq(redis_pttl(keys[2]), -2);
    ck_assert_int_eq(sk_lock_release(b, keys[1], theirs, &err), SK_OK);
    sk_lock_close(a);
    sk_lock_close(b);
}
END_TEST

/* A script riding with a swap (sk_lock_swap_riding(), as the rate limit
 * rides with a batch's locks): one write, both answered; its script known
 * and not yet loaded is loaded first; after SCRIPT FLUSH both scripts are
 * loaded again and both answered, the swap's taking once (its key's token
 * is ours). A ride alone (n 0) is answered too. */
START_TEST(test_a_ride_is_answered_with_the_swap_and_after_a_flush)
{
    struct sk_lock *a, *b;
    struct sk_err err = { 0 };
    struct three t;
    three_locks(&t, "ride", &a, &b);
    static const char script[] = "return {tonumber(ARGV[1]), #KEYS}";
    char sha[41] = "";
    const char *rkeys[2] = { "sekali:rate:ride-a", "sekali:rate:ride-b" };
    const char *args[1] = { "7" };
    long long out[2] = { 0, 0 };
    struct sk_lock_ride ride = { .script = script, .sha = sha, .n_keys = 2, .keys = rkeys,
                                 .n_args = 1, .args = args, .out = out, .n_out = 2 };
    int rc[2];
    ck_assert_msg(sk_lock_swap_riding(a, &ride, 0, 1, t.key_list, t.token_list, 60000, 1, rc,
                                      &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(ride.rc == SK_OK, "%s", ride.err.msg);
    ck_assert_int_eq(out[0], 7);
    ck_assert_int_eq(out[1], 2);
    ck_assert_int_eq(rc[0], SK_OK);
    ck_assert_int_eq(strlen(sha), 40);

    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    freeReplyObject(redisCommand(redis, "SCRIPT FLUSH"));
    redisFree(redis);
    out[0] = out[1] = 0;
    args[0] = "9";
    ck_assert_msg(sk_lock_swap_riding(a, &ride, 0, 1, t.key_list + 1, t.token_list + 1, 60000, 1,
                                      rc, &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(ride.rc == SK_OK, "%s", ride.err.msg);
    ck_assert_int_eq(out[0], 9);
    ck_assert_int_eq(rc[0], SK_OK);
    ck_assert_msg(redis_pttl(t.keys[1]) > 50000, "the swap should have taken key 1");

    out[0] = 0;
    args[0] = "11";
    ck_assert_int_eq(sk_lock_swap_riding(a, &ride, 0, 0, NULL, NULL, 0, 1, NULL, &ride.err),
                     SK_OK);
    ck_assert_msg(ride.rc == SK_OK, "%s", ride.err.msg);
    ck_assert_int_eq(out[0], 11);
    ck_assert_int_eq(sk_lock_release(a, t.keys[0], t.tokens[0], &err), SK_OK);
    ck_assert_int_eq(sk_lock_release(a, t.keys[1], t.tokens[1], &err), SK_OK);
    sk_lock_close(a);
    sk_lock_close(b);
}
END_TEST

/* The heartbeat's renewal of a span's locks: one round trip extends each
 * lock still ours and answers busy for one another owner took, without
 * touching it; after SCRIPT FLUSH the script is loaded again and every key
 * still answered for. */
START_TEST(test_pipelined_renewal_extends_ours_and_spares_the_taken_one)
{
    struct sk_lock *a, *b;
    struct sk_err err = { 0 };
    struct three t;
    three_locks(&t, "renew", &a, &b);
    char (*keys)[64] = t.keys, (*tokens)[SK_LOCK_TOKEN_LEN + 1] = t.tokens;
    const char **key_list = t.key_list, **token_list = t.token_list;
    char theirs[SK_LOCK_TOKEN_LEN + 1];
    int rc[3];
    ck_assert_msg(sk_lock_acquire_many(a, 3, key_list, token_list, 5000, rc, &err) == SK_OK,
                  "%s", err.msg);
    ck_assert(rc[0] == SK_OK && rc[1] == SK_OK && rc[2] == SK_OK);
    /* Key 1 expires and another owner takes it. */
    ck_assert_int_eq(sk_lock_release(a, keys[1], tokens[1], &err), SK_OK);
    sk_lock_new_token(theirs);
    ck_assert_int_eq(sk_lock_acquire(b, keys[1], theirs, 5000, &err), SK_OK);

    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
            ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
            freeReplyObject(redisCommand(redis, "SCRIPT FLUSH"));
            redisFree(redis);
        }
        ck_assert_msg(sk_lock_renew_many(a, 3, key_list, token_list, 60000, rc, &err) == SK_OK,
                      "round %d: %s", round, err.msg);
        ck_assert_int_eq(rc[0], SK_OK);
        ck_assert_int_eq(rc[1], SK_BUSY);
        ck_assert_int_eq(rc[2], SK_OK);
        ck_assert_msg(redis_pttl(keys[0]) > 50000, "key 0 should be renewed to 60 s");
        ck_assert_msg(redis_pttl(keys[2]) > 50000, "key 2 should be renewed to 60 s");
        ck_assert_msg(redis_pttl(keys[1]) <= 5000, "the other owner's lease must stay its own");
    }
    ck_assert_msg(sk_lock_release_many(a, 3, key_list, token_list, rc, &err) == SK_OK,
                  "%s", err.msg);
    ck_assert_int_eq(sk_lock_release(b, keys[1], theirs, &err), SK_OK);
    sk_lock_close(a);
    sk_lock_close(b);
}
END_TEST

/* A semaphore (limit above 1): up to limit tokens hold one key at once,
 * the next is refused; renewal extends only a holder's own entry and
 * release removes only its own; a holder that stops renewing (a worker
 * SIGKILLed) counts for nothing past its expiry, on Redis's clock: a new
 * token is admitted then, and the dead one may not renew any more. */
START_TEST(test_semaphore_admits_up_to_its_limit_and_drops_the_expired)
{
    struct sk_redis_conf conf = redis_conf();
    struct sk_lock *a;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_lock_open(&a, &conf, &err) == SK_OK, "%s", err.msg);
    char key[64], tok[5][SK_LOCK_TOKEN_LEN + 1];
    snprintf(key, sizeof(key), "sekali:lock:sem-%d:r", (int)getpid());
    const char *k[1] = { key }, *t[1];
    int rc[1];
    for (int i = 0; i < 5; i++)
        sk_lock_new_token(tok[i]);
    /* Three long holders, then one that stops renewing: full at 3. */
    for (int i = 0; i < 3; i++) {
        t[0] = tok[i];
        uint32_t ttl = i == 2 ? 500 : 60000;
        ck_assert_msg(sk_lock_swap_many(a, 0, 1, k, t, ttl, 3, rc, &err) == SK_OK, "%s",
                      err.msg);
        ck_assert_msg(rc[0] == SK_OK, "holder %d of 3 should be admitted", i + 1);
    }
    t[0] = tok[3];
    ck_assert_int_eq(sk_lock_swap_many(a, 0, 1, k, t, 60000, 3, rc, &err), SK_OK);
    ck_assert_msg(rc[0] == SK_BUSY, "a fourth holder of a semaphore of 3 was admitted");
    ck_assert_int_eq(sk_lock_renew(a, key, tok[3], 60000, &err), SK_BUSY);
    ck_assert_int_eq(sk_lock_release(a, key, tok[3], &err), SK_BUSY);
    ck_assert_int_eq(sk_lock_renew(a, key, tok[0], 60000, &err), SK_OK);
    long long ttl = redis_pttl(key);
    ck_assert_msg(ttl > 50000, "the key should live as long as its last holder: pttl %lld", ttl);
    /* The short holder is gone by its expiry: the fourth gets its permit. */
    H_WAIT(sk_lock_swap_many(a, 0, 1, k, t, 60000, 3, rc, &err) == SK_OK && rc[0] == SK_OK,
           10000, "the expired holder's permit should be free after its 500 ms");
    ck_assert_int_eq(sk_lock_renew(a, key, tok[2], 60000, &err), SK_BUSY);
    ck_assert_int_eq(sk_lock_release(a, key, tok[2], &err), SK_BUSY);
    /* A release frees one permit, the releaser's own, with the next take. */
    const char *k2[2] = { key, key }, *t2[2] = { tok[0], tok[4] };
    int rc2[2];
    ck_assert_int_eq(sk_lock_swap_many(a, 1, 2, k2, t2, 60000, 3, rc2, &err), SK_OK);
    ck_assert_msg(rc2[0] == SK_OK && rc2[1] == SK_OK, "release then take: %d %d", rc2[0],
                  rc2[1]);
    int renewed[3];
    const char *holders[3] = { tok[1], tok[3], tok[4] }, *keys3[3] = { key, key, key };
    ck_assert_int_eq(sk_lock_renew_many(a, 3, keys3, holders, 60000, renewed, &err), SK_OK);
    ck_assert(renewed[0] == SK_OK && renewed[1] == SK_OK && renewed[2] == SK_OK);
    ck_assert_int_eq(sk_lock_release_many(a, 3, keys3, holders, renewed, &err), SK_OK);
    ck_assert(!h_redis_exists(key));
    /* Limit 1 is the plain lock, and a plain lock held is busy to a semaphore. */
    t[0] = tok[0];
    ck_assert_int_eq(sk_lock_swap_many(a, 0, 1, k, t, 60000, 1, rc, &err), SK_OK);
    ck_assert_int_eq(rc[0], SK_OK);
    t[0] = tok[1];
    ck_assert_int_eq(sk_lock_swap_many(a, 0, 1, k, t, 60000, 3, rc, &err), SK_OK);
    ck_assert_int_eq(rc[0], SK_BUSY);
    ck_assert_int_eq(sk_lock_release(a, key, tok[0], &err), SK_OK);
    sk_lock_close(a);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_lock_keys_with_protocol_characters_stay_one_argument,
        test_lock_scripts_flushed_by_redis_are_loaded_again,
        test_lock_tokens_are_unique_and_a_forked_child_draws_its_own,
        test_pipelined_acquire_and_release_answer_for_each_key,
        test_pipelined_renewal_extends_ours_and_spares_the_taken_one,
        test_swap_releases_ours_before_it_takes_the_next,
        test_a_ride_is_answered_with_the_swap_and_after_a_flush,
        test_semaphore_admits_up_to_its_limit_and_drops_the_expired,
        NULL,
    };
    Suite *s = suite_create("lock");
    h_tcase(s, "lock", 120, tests);
    return h_run_suite(s);
}
