/* doctor_pages.c - doctor's verdict on the pages under PostgreSQL's shared
 * buffers (doctor.h). A new key's claim reads a few pages of each keys
 * table's primary key at random (producers' keys are random); a server
 * sized for a long history holds those indexes in its shared buffers, and
 * on 4 kB pages each buffer touched there costs the CPU an address
 * translation its TLB does not hold, from page tables (2 MB a GB of
 * buffers, in every backend) too large for its caches. Measured at 100 M
 * archived keys with 6 GB of shared buffers (docs/benchmark.md): a claim
 * of 12 new keys took 1.7x an empty store's on 4 kB pages, about 1.1x on
 * huge pages; with the default 128 MB no difference was measured. 2 GB is
 * the bound between them, where a backend's page tables for the buffers
 * reach 4 MB. Not in the cheap subset: a matter of speed, not of the
 * guarantee. */
#include <stdio.h>
#include <string.h>

#include "doctor.h"

#define HUGE_PAGES_FROM_BYTES (2LL << 30)

void sk_doctor_postgres_pages(struct sk_doctor *d, long long shared_buffers,
                              const char *huge_pages, const char *status)
{
    double gb = (double)shared_buffers / (1 << 30);
    /* huge_pages = on refuses to start without them. */
    if (strcmp(status, "on") == 0 || strcmp(huge_pages, "on") == 0) {
        sk_doctor_add(d, "postgres.huge_pages", "", SK_DOCTOR_PASS, NULL,
                      "shared_buffers %.1f GB on huge pages", gb);
        return;
    }
    if (shared_buffers < HUGE_PAGES_FROM_BYTES) {
        sk_doctor_add(d, "postgres.huge_pages", "", SK_DOCTOR_PASS, NULL,
                      "shared_buffers %.1f GB: under 2 GB, 4 kB pages cost claims nothing "
                      "measurable", gb);
        return;
    }
    const char *fix = "reserve huge pages on the server (sysctl vm.nr_hugepages = what `postgres "
                      "-C shared_memory_size_in_huge_pages` says) and set huge_pages = on, "
                      "which refuses to start without them";
    const char *cost = "each buffer a claim touches costs the CPU a page-table walk (at 100 M "
                       "keys in 6 GB, a claim took 1.7x an empty store's, 1.1x on huge pages)";
    if (strcmp(status, "off") == 0 || strcmp(huge_pages, "off") == 0)
        sk_doctor_add(d, "postgres.huge_pages", "", SK_DOCTOR_WARN, fix,
                      "shared_buffers %.1f GB on 4 kB pages: %s", gb, cost);
    else
        sk_doctor_add(d, "postgres.huge_pages", "", SK_DOCTOR_WARN, fix,
                      "shared_buffers %.1f GB with huge_pages = %s, which falls back to 4 kB "
                      "pages unseen before PostgreSQL 17: %s", gb, huge_pages, cost);
}
