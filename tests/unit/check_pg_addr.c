/* check_pg_addr.c - which PostgreSQL connections pg.c calls local, and so
 * exempt from the warning about a server reached without TLS. The warning
 * itself needs a server on another machine; this is its rule. */
/* links: core pg */
#include "pg.h"
#include "suite.h"

#include <check.h>

START_TEST(test_unix_sockets_and_loopback_addresses_are_local)
{
    ck_assert(sk_pg_is_local("/var/run/postgresql", NULL));
    ck_assert(sk_pg_is_local("@abstract", ""));
    ck_assert(sk_pg_is_local("localhost", NULL));
    ck_assert(sk_pg_is_local("db.example", "127.0.0.1"));
    ck_assert(sk_pg_is_local("127.1.2.3", "127.1.2.3"));
    ck_assert(sk_pg_is_local("::1", "::1"));
    ck_assert(sk_pg_is_local("x", "::ffff:127.0.0.1"));
}
END_TEST

START_TEST(test_any_other_address_is_remote)
{
    ck_assert(!sk_pg_is_local("db.example", "10.0.0.5"));
    ck_assert(!sk_pg_is_local("localhost", "192.168.1.1"));  /* hostaddr is what was reached */
    ck_assert(!sk_pg_is_local("db.example", "2001:db8::1"));
    ck_assert(!sk_pg_is_local("x", "::ffff:10.0.0.1"));
    ck_assert(!sk_pg_is_local("db.example", NULL));
    ck_assert(!sk_pg_is_local(NULL, NULL));
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_unix_sockets_and_loopback_addresses_are_local,
        test_any_other_address_is_remote,
        NULL,
    };
    return h_run_suite(h_suite("pg_addr", 0, tests));
}
