#!/usr/bin/env python3
"""tests/bench/tls_calls.py - per link, what sekalid's workers did per job:
system calls by kind, bytes, and TLS records (application data records,
and all others), from strace -ff -yy -xx output files.

    tls_calls.py JOBS LINK=PORT[,PORT] ... -- TRACE_FILE ...

Each TRACE_FILE is one process's trace (strace -ff -o PREFIX). A socket is
given to the link whose PORT is its peer's port. A TLS link's bytes, read
as one stream per connection and direction, are walked record by record
(5-byte headers: type, version, length); a clear-text link has none. The
counts are divided by JOBS. Prints one line per link and direction, then
every system call of the traced processes per job, the most frequent named."""
import collections
import re
import sys

CALL = re.compile(r'^(?P<call>read|write|sendto|recvfrom|sendmsg|recvmsg|readv|writev)\('
                  r'(?P<fd>\d+)<TCP(?:v6)?:\[(?P<local>[^\]]*?)->(?P<peer>[^\]]*?)\]>, '
                  r'(?P<rest>.*)\) = (?P<rc>-?\d+)')
HEX = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')
PG_SSL_REQUEST = bytes.fromhex('0000000804d2162f')
WRITES = {'write', 'sendto', 'sendmsg', 'writev'}


def main():
    sep = sys.argv.index('--')
    jobs = int(sys.argv[1])
    links = {}
    for spec in sys.argv[2:sep]:
        name, ports = spec.split('=')
        for p in ports.split(','):
            links[p] = name
    calls = collections.Counter()       # (link, dir, call) -> n
    nbytes = collections.Counter()      # (link, dir) -> bytes
    streams = collections.defaultdict(bytearray)  # (file, fd, peer, dir) -> bytes
    every = collections.Counter()       # system call name -> n, whatever the fd
    for path in sys.argv[sep + 1:]:
        with open(path, errors='replace') as f:
            for line in f:
                name = re.match(r'^([a-z0-9_]+)\(', line)
                if name:
                    every[name.group(1)] += 1
                m = CALL.match(line)
                if not m or int(m.group('rc')) <= 0:
                    continue
                port = m.group('peer').rsplit(':', 1)[-1]
                link = links.get(port)
                if link is None:
                    continue
                direction = 'out' if m.group('call') in WRITES else 'in'
                calls[(link, direction, m.group('call'))] += 1
                rc = int(m.group('rc'))
                nbytes[(link, direction)] += rc
                data = ''.join(HEX.findall(m.group('rest')))
                raw = bytes.fromhex(data.replace('\\x', ''))[:rc]
                streams[(path, m.group('fd'), m.group('peer'), link, direction)] += raw
    records = collections.Counter()
    for (_, _, _, link, direction), s in streams.items():
        # PostgreSQL's TLS starts after an SSLRequest and its one-byte 'S'.
        i = 8 if s.startswith(PG_SSL_REQUEST) else 1 if s[:1] == b'S' else 0
        while i + 5 <= len(s):
            rtype, length = s[i], int.from_bytes(s[i + 3:i + 5], 'big')
            if rtype not in (0x14, 0x15, 0x16, 0x17) or s[i + 1] != 3:
                break  # not TLS: a clear-text link
            records[(link, direction, 'app' if rtype == 0x17 else 'other')] += 1
            i += 5 + length
    print('%-6s %-3s %9s %9s %9s %9s  %s' % ('link', 'dir', 'calls/job', 'bytes/job',
                                            'app rec', 'other rec', 'calls by kind'))
    for link in sorted(set(links.values())):
        for direction in ('out', 'in'):
            kinds = {c: n for (l, d, c), n in calls.items() if l == link and d == direction}
            total = sum(kinds.values())
            print('%-6s %-3s %9.2f %9.1f %9.2f %9.2f  %s' % (
                link, direction, total / jobs, nbytes[(link, direction)] / jobs,
                records[(link, direction, 'app')] / jobs, records[(link, direction, 'other')] / jobs,
                ' '.join('%s=%.2f' % (c, n / jobs) for c, n in sorted(kinds.items()))))
    top = ' '.join('%s=%.2f' % (c, n / jobs) for c, n in every.most_common(8))
    print('all system calls: %.2f/job (%s)' % (sum(every.values()) / jobs, top))


if __name__ == '__main__':
    main()
