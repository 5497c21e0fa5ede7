/* file.h - opening a file the configuration names (a password, a token, a
 * TLS key or certificate, the config itself) at start, `sekalid -t` and
 * reload: the one check every such path goes through.
 *
 * Each of these runs in a process that must not stop: a FIFO opened for
 * reading waits for a writer, and a device may never end, so anything but a
 * regular file is refused before a byte is read. A secret that others may
 * read has leaked already, so its mode is checked too. */
#ifndef SK_FILE_H
#define SK_FILE_H

#include <sys/stat.h>

/* Why sk_file_open() refused a file it could open; no errno value has
 * these meanings. */
#define SK_FILE_NOT_REGULAR (-1)  /* a FIFO, device, socket */
#define SK_FILE_TOO_OPEN    (-2)  /* its mode has one of the refused bits */

/* Opens path read-only and close-on-exec, without waiting for a FIFO's
 * writer, and keeps it only if it is a regular file whose mode has none of
 * the bits in `refused` (e.g. S_IRWXG | S_IRWXO for a private key; 0 for a
 * file anyone may read). Returns 0 with *fd open in blocking mode (the
 * caller closes it) and *st filled, or why not: an errno value (EISDIR for
 * a directory), SK_FILE_NOT_REGULAR or SK_FILE_TOO_OPEN, with *fd -1 and
 * *st filled when the file could be stat'ed. Never reads the content. Any
 * thread; blocks only as open() on a regular file does. */
int sk_file_open(const char *path, mode_t refused, int *fd, struct stat *st);

/* e (an sk_file_open() result) in words, e.g. "not a regular file (a FIFO,
 * device or socket)"; static. */
const char *sk_file_error(int e);

#endif
