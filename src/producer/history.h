/* history.h - each queue's outcomes per minute in sekali.history, written
 * by the janitor (history.c). */
#ifndef SK_HISTORY_H
#define SK_HISTORY_H

#include <libpq-fe.h>

#include "config.h"
#include "metrics.h"

struct sk_history;

/* The writer of one janitor process. `fresh`: no janitor of this sekalid
 * has finished a round yet, so everything the workers counted is new;
 * otherwise (a janitor that replaces one that died, or a reload's) what
 * is counted now was written already, or is lost with its predecessor:
 * never written twice. NULL when out of memory. */
struct sk_history *sk_history_new(const struct sk_conf *conf, struct sk_metrics *m, bool fresh);
void sk_history_free(struct sk_history *h);

/* Adds what the workers counted since the last successful call to the
 * current minute's rows (sql/037), one statement for every queue, none
 * when nothing happened. SK_OK, or the failure's code after logging it:
 * the counts then go into a later minute. */
int sk_history_write(struct sk_history *h, PGconn *pg);

#endif
