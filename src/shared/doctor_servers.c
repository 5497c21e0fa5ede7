/* doctor_servers.c - doctor's checks of PostgreSQL and Redis (doctor.h):
 * the schema, synchronous commit and standbys, the clocks of host,
 * PostgreSQL and Redis, retention against the oldest waiting job; Redis'
 * eviction policy, its role and the Sentinel quorum. Redis is reached as
 * the locks reach it (redis_link.c: TLS when redis.tls says so). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <hiredis.h>

#include "config_value.h"
#include "doctor.h"
#include "pg.h"
#include "redis_link.h"
#include "schema.h"

static bool check_schema(struct sk_doctor *d, PGconn *pg);
static void check_sync(struct sk_doctor *d, PGconn *pg);
static void check_retention(struct sk_doctor *d, PGconn *pg);
static void check_key_memory(struct sk_doctor *d, PGconn *pg);
static void check_pages(struct sk_doctor *d, PGconn *pg);
static void check_skew(struct sk_doctor *d, const char *object, int64_t skew_ms);
static bool pg_exec(struct sk_doctor *d, PGconn *pg, const struct sk_pg_stmt *st,
                    PGresult **out, const char *check, const char *object);
static bool pg_value(struct sk_doctor *d, PGconn *pg, const char *sql, char *out, size_t size,
                     const char *check);
static struct sk_redis_link *redis_dial(const struct sk_redis_conf *rc, bool master,
                                        const char *host, int port, char *why, size_t size);
static bool info_field(const char *info, const char *name, char *out, size_t size);
struct redis_facts;
static void ask_sentinels(struct sk_doctor *d, char *host, size_t size, int *port);
static void redis_facts(struct sk_redis_link *c, struct redis_facts *f);
static void check_redis_facts(struct sk_doctor *d, const char *object,
                              const struct redis_facts *f);

void sk_doctor_postgres(struct sk_doctor *d)
{
    struct sk_err err = { 0 };
    PGconn *pg = sk_pg_dial(&d->conf->postgres, "sekali doctor", &err);
    if (pg == NULL) {
        sk_doctor_add(d, "postgres.reachable", "", SK_DOCTOR_FAIL,
                      "make postgres.conninfo reach the server sekalid uses", "%s", err.msg);
        return;
    }
    bool migrated = check_schema(d, pg);
    if (!d->cheap) {
        sk_doctor_postgres_version(d, PQserverVersion(pg));
        check_pages(d, pg);
    }
    check_sync(d, pg);
    /* The server's clock against the host's, at the middle of the round
     * trip. */
    char now[64];
    int64_t t0 = sk_doctor_now_ms();
    if (pg_value(d, pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint", now,
                 sizeof(now), "clock.skew")) {
        int64_t t1 = sk_doctor_now_ms();
        check_skew(d, "host-postgres", atoll(now) - (t0 + t1) / 2);
    }
    if (d->cheap)
        ;  /* retention reads the outbox: not cheap; the workers quarantine such jobs */
    else if (migrated) {
        check_retention(d, pg);
        check_key_memory(d, pg);
    } else
        sk_doctor_add(d, "retention", "", SK_DOCTOR_SKIP, NULL, "not judged on an unmigrated schema");
    PQfinish(pg);
}

/* Whether every migration is applied (the other checks read its tables). */
static bool check_schema(struct sk_doctor *d, PGconn *pg)
{
    struct sk_schema_state st;
    struct sk_err err = { 0 };
    if (sk_schema_read(pg, &st, &err) != SK_OK) {
        sk_doctor_add(d, "schema", "", SK_DOCTOR_FAIL, "grant sekali's role read on sekali.*",
                      "cannot read the applied migrations: %s", err.msg);
        return false;
    }
    if (st.n_missing > 0)
        sk_doctor_add(d, "schema", "", SK_DOCTOR_FAIL, "run sekalictl migrate",
                      "%zu of this build's %zu migrations not applied: %s; sekalid refuses "
                      "to start on it", st.n_missing, sk_schema_n_migrations, st.missing);
    else
        sk_doctor_add(d, "schema", "", SK_DOCTOR_PASS, NULL, "all %zu migrations applied",
                      sk_schema_n_migrations);
    if (st.n_unknown > 0)
        sk_doctor_add(d, "schema.unknown", "", SK_DOCTOR_WARN,
                      "upgrade sekali on this host to the version that migrated the database",
                      "%zu applied migrations this build does not know: %s", st.n_unknown,
                      st.unknown);
    return st.n_missing == 0;
}

/* synchronous_commit as sekali's sessions have it (sk_pg_dial() raises a
 * server default of off to on), and a synchronous standby wherever a
 * failover is possible: several hosts in the conninfo, or standbys
 * attached. */
static void check_sync(struct sk_doctor *d, PGconn *pg)
{
    char commit[32], standbys[64], names[256];
    if (!pg_value(d, pg, "SELECT current_setting('synchronous_commit')", commit,
                  sizeof(commit), "postgres.synchronous") ||
        !pg_value(d, pg, "SELECT count(*) || ' ' || count(*) FILTER (WHERE sync_state IN "
                         "('sync', 'quorum')) FROM pg_stat_replication", standbys,
                  sizeof(standbys), "postgres.synchronous") ||
        !pg_value(d, pg, "SELECT current_setting('synchronous_standby_names')", names,
                  sizeof(names), "postgres.synchronous"))
        return;
    if (strcmp(commit, "off") == 0)
        sk_doctor_add(d, "postgres.synchronous_commit", "", SK_DOCTOR_FAIL,
                      "remove synchronous_commit=off from the conninfo's options",
                      "off: a server crash loses jobs whose effects were acked");
    else
        sk_doctor_add(d, "postgres.synchronous_commit", "", SK_DOCTOR_PASS, NULL, "%s", commit);

    long all = 0, sync = 0;
    sscanf(standbys, "%ld %ld", &all, &sync);
    /* libpq separates the hosts of a multi-host conninfo by commas. */
    const char *host = strstr(d->conf->postgres.conninfo, "host=");
    bool several = host != NULL && strchr(host, ',') != NULL &&
                   strchr(host, ',') < host + strcspn(host, " ");
    bool remote = strcmp(commit, "on") == 0 || strncmp(commit, "remote_", 7) == 0;
    if (!several && all == 0)
        sk_doctor_add(d, "postgres.standby", "", SK_DOCTOR_PASS, NULL,
                      "one server, no standby attached: nothing to fail over to");
    else if (sync > 0 && remote)
        sk_doctor_add(d, "postgres.standby", "", SK_DOCTOR_PASS, NULL,
                      "%ld of %ld standbys synchronous (%s)", sync, all, names);
    else
        sk_doctor_add(d, "postgres.standby", "", several ? SK_DOCTOR_FAIL : SK_DOCTOR_WARN,
                      "set synchronous_standby_names on the primary (and synchronous_commit "
                      "on or remote_apply)",
                      "%s, %ld standbys, none synchronous%s: without a synchronous standby a "
                      "failover can lose effects that were already acked",
                      several ? "several hosts in the conninfo" : "standbys attached", all,
                      sync > 0 ? " for sekali's sessions (synchronous_commit local)" : "");
}

/* The oldest job the outbox enqueued that no worker has claimed yet: it
 * waits in the queue, a delay queue, or for the relay. Only keys finished
 * longer than retention ago are purged, so a copy waiting longer than that
 * could find its key gone and run again. Jobs published straight to the
 * broker have no outbox row and are not seen. One bounded query a queue,
 * over the outbox (which the janitor keeps to outbox_retention). */
static void check_retention(struct sk_doctor *d, PGconn *pg)
{
    for (size_t i = 0; i < d->conf->n_queues; i++) {
        const struct sk_queue_conf *q = &d->conf->queues[i];
        const char *params[] = { q->name };
        const struct sk_pg_stmt st = {
            .sql = "SELECT (extract(epoch FROM now() - min(o.run_at)) * 1000)::bigint "
                   "FROM sekali.outbox o WHERE o.queue = $1 AND o.run_at <= now() "
                   "AND sekali.key_status(o.queue, o.idempotency_key) IS NULL",
            .n_params = 1, .values = params, .one_row = true, .what = "oldest waiting job",
        };
        PGresult *res;
        if (!pg_exec(d, pg, &st, &res, "retention", q->name))
            continue;
        char keep[32], age[32];
        if (q->retention_ms == SK_RETENTION_FOREVER)
            snprintf(keep, sizeof(keep), "forever");
        else
            sk_conf_value_fmt_duration(q->retention_ms, keep, sizeof(keep));
        if (PQgetisnull(res, 0, 0)) {
            sk_doctor_add(d, "retention", q->name, SK_DOCTOR_PASS, NULL,
                          "no job waiting; keys kept %s", keep);
        } else {
            long long ms = atoll(PQgetvalue(res, 0, 0));
            sk_conf_value_fmt_duration(ms > 0 ? (uint64_t)ms : 0, age, sizeof(age));
            enum sk_doctor_level level = (uint64_t)ms > q->retention_ms       ? SK_DOCTOR_FAIL
                                         : (uint64_t)ms > q->retention_ms / 2 ? SK_DOCTOR_WARN
                                                                              : SK_DOCTOR_PASS;
            sk_doctor_add(d, "retention", q->name, level,
                          "drain the queue (sekalictl status), or raise the queue's retention "
                          "above the longest a job can wait",
                          "the oldest waiting job was enqueued %s ago; keys are kept %s%s", age,
                          keep, level == SK_DOCTOR_FAIL ? ": its key may be purged already, so a "
                                                          "duplicate could run twice" : "");
        }
        PQclear(res);
    }
}

static void check_skew(struct sk_doctor *d, const char *object, int64_t skew_ms)
{
    int64_t a = skew_ms < 0 ? -skew_ms : skew_ms;
    enum sk_doctor_level level = a >= SK_DOCTOR_SKEW_FAIL_MS   ? SK_DOCTOR_FAIL
                                 : a >= SK_DOCTOR_SKEW_WARN_MS ? SK_DOCTOR_WARN
                                                               : SK_DOCTOR_PASS;
    sk_doctor_add(d, "clock.skew", object, level,
                  "run NTP (chrony, systemd-timesyncd) on every host, the servers' too",
                  "%+lld ms (warn from %d ms, fail from %d ms): leases and retention are "
                  "judged by the servers' clocks, schedules and timestamps by the hosts'",
                  (long long)skew_ms, SK_DOCTOR_SKEW_WARN_MS, SK_DOCTOR_SKEW_FAIL_MS);
}

/* A statement that fails is the check's failed verdict, with the reason. */
static bool pg_exec(struct sk_doctor *d, PGconn *pg, const struct sk_pg_stmt *st,
                    PGresult **out, const char *check, const char *object)
{
    struct sk_err err = { 0 };
    if (sk_pg_exec(pg, st, out, &err) == SK_OK)
        return true;
    sk_doctor_add(d, check, object, SK_DOCTOR_FAIL, NULL, "cannot ask PostgreSQL: %s", err.msg);
    return false;
}

/* Every new key's claim reads a leaf of the keys' primary key at random
 * (producers' keys are random): once that index outgrows the memory
 * PostgreSQL can count on, a claim waits for a disk read (at 100 M keys, a
 * 6.8 GB index on a 24 GB server, jobs/s fell to 0.72-0.78x:
 * docs/benchmark.md). With keys archived (sql/040) it reads a leaf of
 * each table's: their sum is what must fit. Half of effective_cache_size,
 * the memory the server was told it has, is the bound: the heaps and the
 * other tables share it. The indexes' sizes are their files', not a scan. */
static void check_key_memory(struct sk_doctor *d, PGconn *pg)
{
    char found[160];
    if (!pg_value(d, pg, "SELECT (i <= c / 2)::text || '|' || pg_size_pretty(i) || '|' || "
                         "pg_size_pretty(c) FROM (SELECT "
                         "pg_relation_size('sekali.idempotency_keys_pkey') + coalesce("
                         "pg_relation_size(to_regclass('sekali.finished_keys_pkey')), 0) AS i, "
                         "pg_size_bytes(current_setting('effective_cache_size')) AS c) s",
                  found, sizeof(found), "retention.memory"))
        return;
    char fits[8] = "", index[64] = "?", cache[64] = "?";
    sscanf(found, "%7[^|]|%63[^|]|%63[^|]", fits, index, cache);
    if (strcmp(fits, "true") == 0)
        sk_doctor_add(d, "retention.memory", "", SK_DOCTOR_PASS, NULL,
                      "the keys' primary keys are %s, effective_cache_size %s", index, cache);
    else
        sk_doctor_add(d, "retention.memory", "", SK_DOCTOR_WARN,
                      "give PostgreSQL the memory (and set effective_cache_size to it), keep "
                      "keys a shorter retention, or have producers send time-ordered keys "
                      "(UUIDv7), which new claims find on the same few pages",
                      "the keys' primary keys are %s, more than half of effective_cache_size "
                      "(%s): a new key's claim reads its page from outside memory", index,
                      cache);
}

/* shared_buffers and whether huge pages hold them (doctor_pages.c judges). */
static void check_pages(struct sk_doctor *d, PGconn *pg)
{
    char found[160];
    if (!pg_value(d, pg, "SELECT pg_size_bytes(current_setting('shared_buffers')) || '|' || "
                         "current_setting('huge_pages') || '|' || "
                         "coalesce(current_setting('huge_pages_status', true), '')",
                  found, sizeof(found), "postgres.huge_pages"))
        return;
    long long bytes = 0;
    char huge_pages[16] = "", status[16] = "";
    sscanf(found, "%lld|%15[^|]|%15[^|]", &bytes, huge_pages, status);
    sk_doctor_postgres_pages(d, bytes, huge_pages, status);
}

/* The first column of the one row sql returns, as text. */
static bool pg_value(struct sk_doctor *d, PGconn *pg, const char *sql, char *out, size_t size,
                     const char *check)
{
    const struct sk_pg_stmt st = { .sql = sql, .one_row = true };
    PGresult *res;
    if (!pg_exec(d, pg, &st, &res, check, ""))
        return false;
    snprintf(out, size, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return true;
}

/* A Redis server's settings sekali depends on, as INFO tells them (ROLE
 * when INFO is refused): each "" when unknown; refused says why. */
struct redis_facts {
    char policy[64], role[32], replicas[16], refused[160];
    char server[8], version[64];   /* "Redis" or "Valkey"; "" if INFO was refused */
};

void sk_doctor_redis(struct sk_doctor *d)
{
    const struct sk_redis_conf *rc = &d->conf->redis;
    char host[256], why[300];
    int port = rc->port;
    snprintf(host, sizeof(host), "%s", rc->host != NULL ? rc->host : "");
    ask_sentinels(d, host, sizeof(host), &port);
    if (host[0] == '\0') {
        sk_doctor_add(d, "redis.reachable", rc->master_name, SK_DOCTOR_FAIL,
                      "check redis.sentinels and redis.master_name",
                      "no sentinel named the master");
        return;
    }
    char object[300];
    snprintf(object, sizeof(object), "%s:%d", host, port);
    struct sk_redis_link *c = redis_dial(rc, true, host, port, why, sizeof(why));
    if (c == NULL) {
        sk_doctor_add(d, "redis.reachable", object, SK_DOCTOR_FAIL,
                      "make the redis section reach the server sekalid locks on", "%s", why);
        return;
    }
    int64_t t0 = sk_doctor_now_ms();
    redisReply *r = sk_redis_link_command(c, "TIME");
    int64_t t1 = sk_doctor_now_ms();
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        check_skew(d, "host-redis",
                   atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000 -
                       (t0 + t1) / 2);
    freeReplyObject(r);
    struct redis_facts f = { .replicas = "0" };
    redis_facts(c, &f);
    check_redis_facts(d, object, &f);
    if (!d->cheap && f.server[0] != '\0')
        sk_doctor_redis_version(d, object, f.server, f.version);
    sk_redis_link_close(c);
}

/* With Sentinel: each sentinel's quorum, and, while host is "", the master
 * it names (into host and *port). */
static void ask_sentinels(struct sk_doctor *d, char *host, size_t size, int *port)
{
    const struct sk_redis_conf *rc = &d->conf->redis;
    char why[300];
    for (size_t i = 0; i < rc->n_sentinels; i++) {
        char object[300];
        snprintf(object, sizeof(object), "%s:%d", rc->sentinels[i].host, rc->sentinels[i].port);
        struct sk_redis_link *s = redis_dial(rc, false, rc->sentinels[i].host,
                                             rc->sentinels[i].port, why, sizeof(why));
        if (s == NULL) {
            sk_doctor_add(d, "redis.sentinel", object, SK_DOCTOR_WARN,
                          "start it, or remove it from redis.sentinels", "%s", why);
            continue;
        }
        redisReply *r = sk_redis_link_command(s, "SENTINEL CKQUORUM %s", rc->master_name);
        bool ok = r != NULL && r->type == REDIS_REPLY_STATUS;
        sk_doctor_add(d, "redis.sentinel", object, ok ? SK_DOCTOR_PASS : SK_DOCTOR_FAIL,
                      "give the master enough reachable sentinels for its quorum",
                      "%s", r != NULL && r->str != NULL ? r->str : sk_redis_link_errstr(s));
        freeReplyObject(r);
        if (host[0] == '\0') {
            r = sk_redis_link_command(s, "SENTINEL get-master-addr-by-name %s", rc->master_name);
            if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
                snprintf(host, size, "%s", r->element[0]->str);
                *port = atoi(r->element[1]->str);
            }
            freeReplyObject(r);
        }
        sk_redis_link_close(s);
    }
}

static void redis_facts(struct sk_redis_link *c, struct redis_facts *f)
{
    redisReply *r = sk_redis_link_command(c, "INFO");
    if (r != NULL && r->type == REDIS_REPLY_STRING) {
        info_field(r->str, "maxmemory_policy", f->policy, sizeof(f->policy));
        info_field(r->str, "role", f->role, sizeof(f->role));
        info_field(r->str, "connected_slaves", f->replicas, sizeof(f->replicas));
        /* Valkey says valkey_version beside a redis_version it keeps at
         * 7.2.4 for clients that look. */
        bool valkey = info_field(r->str, "valkey_version", f->version, sizeof(f->version));
        if (!valkey)
            info_field(r->str, "redis_version", f->version, sizeof(f->version));
        snprintf(f->server, sizeof(f->server), "%s", valkey ? "Valkey" : "Redis");
    } else if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        /* An ACL user limited to sekali's own commands (docs/tls.md) may
         * not run INFO: then the server's settings are unknown, not bad. */
        snprintf(f->refused, sizeof(f->refused), " (INFO refused: %.120s)", r->str);
    }
    freeReplyObject(r);
    if (f->role[0] == '\0') {
        /* ROLE is one of the commands sekali needs anyway (the Sentinel
         * failover check), so its ACL user has it when INFO is refused. */
        r = sk_redis_link_command(c, "ROLE");
        if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            r->element[0]->type == REDIS_REPLY_STRING)
            snprintf(f->role, sizeof(f->role), "%s", r->element[0]->str);
        if (strcmp(f->role, "master") == 0 && r->elements > 2 &&
            r->element[2]->type == REDIS_REPLY_ARRAY)
            snprintf(f->replicas, sizeof(f->replicas), "%zu", r->element[2]->elements);
        freeReplyObject(r);
    }
}

static void check_redis_facts(struct sk_doctor *d, const char *object,
                              const struct redis_facts *f)
{
    /* Lock keys carry a TTL, so volatile-* policies evict them as readily
     * as allkeys-*: only noeviction keeps a held lock. */
    if (f->policy[0] == '\0')
        sk_doctor_add(d, "redis.maxmemory_policy", object, SK_DOCTOR_WARN, NULL,
                      "INFO did not tell the policy%s", f->refused);
    else if (strcmp(f->policy, "noeviction") == 0)
        sk_doctor_add(d, "redis.maxmemory_policy", object, SK_DOCTOR_PASS, NULL, "noeviction");
    else
        sk_doctor_add(d, "redis.maxmemory_policy", object, SK_DOCTOR_FAIL,
                      "CONFIG SET maxmemory-policy noeviction (and in redis.conf)",
                      "%s: under memory pressure Redis may evict a held lock, and two "
                      "workers then run one resource at once", f->policy);
    if (strcmp(f->role, "master") == 0)
        sk_doctor_add(d, "redis.role", object, SK_DOCTOR_PASS, NULL, "master, %s replicas",
                      f->replicas);
    else if (f->role[0] == '\0')
        sk_doctor_add(d, "redis.role", object, SK_DOCTOR_WARN, NULL,
                      "INFO did not tell the role%s", f->refused);
    else
        sk_doctor_add(d, "redis.role", object, SK_DOCTOR_FAIL,
                      "point redis at the master (or use redis.sentinels)",
                      "%s: locks cannot be taken on a replica",
                      f->role[0] ? f->role : "unknown");
}

/* A connection within the configured timeout, over TLS when redis.tls
 * says so; the master's authenticated and on the configured database (a
 * sentinel takes neither: its CKQUORUM needs no login here). */
static struct sk_redis_link *redis_dial(const struct sk_redis_conf *rc, bool master,
                                        const char *host, int port, char *why, size_t size)
{
    struct sk_err err = { 0 };
    struct sk_redis_link *c = NULL;
    if (sk_redis_link_open(&c, host, port, &rc->tls, rc->timeout_ms, &err) != SK_OK) {
        snprintf(why, size, "cannot connect: %s", err.msg);
        return NULL;
    }
    if (!master)
        return c;
    redisReply *r = NULL;
    if (rc->password != NULL) {
        r = rc->username != NULL ? sk_redis_link_command(c, "AUTH %s %s", rc->username,
                                                         rc->password)
                                 : sk_redis_link_command(c, "AUTH %s", rc->password);
        bool ok = r != NULL && r->type != REDIS_REPLY_ERROR;
        freeReplyObject(r);
        if (!ok) {
            /* The server's words may echo what was sent: never print them. */
            snprintf(why, size, "AUTH refused");
            sk_redis_link_close(c);
            return NULL;
        }
    }
    if (rc->db != 0) {
        r = sk_redis_link_command(c, "SELECT %d", rc->db);
        bool ok = r != NULL && r->type != REDIS_REPLY_ERROR;
        freeReplyObject(r);
        if (!ok) {
            snprintf(why, size, "SELECT %d refused", rc->db);
            sk_redis_link_close(c);
            return NULL;
        }
    }
    return c;
}

/* The value of "name:value" in INFO's text. */
static bool info_field(const char *info, const char *name, char *out, size_t size)
{
    size_t len = strlen(name);
    for (const char *p = info; (p = strstr(p, name)) != NULL; p += len) {
        if ((p == info || p[-1] == '\n') && p[len] == ':') {
            p += len + 1;
            size_t n = strcspn(p, "\r\n");
            snprintf(out, size, "%.*s", (int)n, p);
            return true;
        }
    }
    return false;
}
