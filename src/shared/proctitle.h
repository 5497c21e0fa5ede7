/* proctitle.h - the title ps, top and journalctl show for a process.
 *
 * Contract:
 *   - sk_proctitle_init(argc, argv) is called once, first thing in main(),
 *     before getopt or getenv: it moves every argv and environ string to the
 *     heap (argv[i] and environ then point at the copies, so nothing that
 *     reads them later notices) and keeps the original, contiguous argv +
 *     environ area as the space a title may be written into.
 *   - sk_proctitle_set(title, comm) writes title over that area (truncated to
 *     fit, the rest zeroed), so /proc/PID/cmdline and `ps -o args` show it,
 *     and sets the thread's comm name (`top`, /proc/PID/comm) to comm,
 *     truncated to 15 bytes. Either may be NULL to leave it alone.
 *   - Not thread-safe: call it while the process has one thread (the
 *     supervisor right after fork, in the child).
 *   - Before init, or if the area could not be found, set() changes only
 *     the comm name. Neither call can fail in a way the caller must handle. */
#ifndef SK_PROCTITLE_H
#define SK_PROCTITLE_H

void sk_proctitle_init(int argc, char **argv);
void sk_proctitle_set(const char *title, const char *comm);

#endif
