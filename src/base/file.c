/* file.c - see file.h. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "file.h"

int sk_file_open(const char *path, mode_t refused, int *fd, struct stat *st)
{
    int e = 0;

    memset(st, 0, sizeof(*st));
    /* O_NONBLOCK: open() of a FIFO would otherwise wait for a writer. */
    *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (*fd < 0)
        return errno;
    if (fstat(*fd, st) != 0)
        e = errno;
    else if (S_ISDIR(st->st_mode))
        e = EISDIR;
    else if (!S_ISREG(st->st_mode))
        e = SK_FILE_NOT_REGULAR;
    else if ((st->st_mode & refused) != 0)
        e = SK_FILE_TOO_OPEN;
    /* Reads of a regular file never wait anyway; blocking mode keeps stdio's
     * view simple for the callers that fdopen() it. */
    else if (fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK) != 0)
        e = errno;
    if (e != 0) {
        close(*fd);
        *fd = -1;
    }
    return e;
}

const char *sk_file_error(int e)
{
    return e == SK_FILE_NOT_REGULAR ? "not a regular file (a FIFO, device or socket)"
           : e == SK_FILE_TOO_OPEN  ? "open to more users than a secret may be"
                                    : strerror(e);
}
