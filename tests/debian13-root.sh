#!/usr/bin/env bash
# tests/debian13-root.sh - a Debian 13 (trixie) root holding today's servers
# (RabbitMQ 4, Valkey, PostgreSQL 17) and librabbitmq 0.15, for the tests.
#
# Debian 12 cannot install trixie's rabbitmq-server (it wants trixie's
# Erlang 27 and libc), so the servers come from a root of their own, made
# once with debootstrap from the same package registry and kept in a cache
# directory; tests/servers.sh runs them there with chroot, in a private
# mount namespace, on the same loopback ports as Debian 12's.
#
# Usage: tests/debian13-root.sh COMMAND
#   ensure      make the root if it is missing or incomplete (idempotent)
#   path        print the root's directory
#   run CMD...  run CMD inside the root (root only; see in_root below);
#               SEKALI_ROOT_BIND=DIR[:DIR...] also shows each host DIR at DIR inside,
#               SEKALI_ROOT_CWD=DIR runs CMD in DIR
#
# Settings: SEKALI_DEBIAN13_ROOT [/var/cache/sekali/debian13]
#           SEKALI_DEBIAN13_MIRROR [http://deb.debian.org/debian]

set -euo pipefail

PROG=debian13-root.sh
say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$PROG" "$*" >&2; exit 1; }

ROOT=${SEKALI_DEBIAN13_ROOT:-/var/cache/sekali/debian13}
ROOT=${ROOT%/}
MIRROR=${SEKALI_DEBIAN13_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
# What the tests run from the root; the stamp names them, so adding one
# here makes `ensure` install it into an existing root.
PACKAGES='rabbitmq-server valkey-server valkey-tools postgresql-17 postgresql-client-17
librabbitmq-dev gcc make pkg-config libpq-dev libhiredis-dev libyaml-dev check
libssl-dev libcurl4-openssl-dev libsystemd-dev libmicrohttpd-dev valgrind curl'
STAMP=$ROOT/.sekali-root

stamp_text() { printf 'suite=%s\npackages=%s\n' "$SUITE" "$(echo $PACKAGES)"; }

# Run CMD inside the root: a private mount namespace (the mounts vanish
# with its last process, so nothing is left mounted on the host) with the
# host's /dev and a /proc, and, when SEKALI_ROOT_BIND is set, each of its
# host directories (colon-separated) at the same path inside, so a server's
# files have one path for the tools outside and the daemon inside.
in_root() {
    [ "$(id -u)" = 0 ] || die "running servers from $ROOT needs root (chroot)"
    local bind=${SEKALI_ROOT_BIND:-} cwd=${SEKALI_ROOT_CWD:-/}
    local dir
    local IFS=:
    for dir in $bind; do mkdir -p "$ROOT$dir"; done
    unset IFS
    exec unshare --mount --propagation private -- /bin/sh -c '
        root=$1 bind=$2 cwd=$3; shift 3
        mount --rbind /dev "$root/dev" &&
        mount -t proc proc "$root/proc" &&
        mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm" || exit 111
        IFS=:
        for dir in $bind; do mount --bind "$dir" "$root$dir" || exit 111; done
        unset IFS
        exec chroot "$root" /usr/bin/env -C "$cwd" "$@"' sh "$ROOT" "$bind" "$cwd" "$@"
}

root_ok() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_text)" ]; }

ensure() {
    root_ok && return 0
    [ "$(id -u)" = 0 ] || die "making $ROOT needs root"
    command -v debootstrap >/dev/null ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >&2 ||
        die "could not install debootstrap"
    local t0=$SECONDS
    mkdir -p "$(dirname "$ROOT")"
    exec 8>"$ROOT.lock"
    flock -w 1800 8 || die "could not lock $ROOT.lock"
    root_ok && return 0
    if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
        say "debootstrap $SUITE into $ROOT (once; a few minutes)"
        rm -rf "$ROOT"
        debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 ||
            { tail -n 20 "$ROOT.log" >&2; die "debootstrap failed (log: $ROOT.log)"; }
    fi
    # The packages' scripts must not start the servers (the tests start
    # their own), nor make PostgreSQL's default cluster.
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
    chmod 755 "$ROOT/usr/sbin/policy-rc.d"
    mkdir -p "$ROOT/etc/postgresql-common"
    echo 'create_main_cluster = false' >"$ROOT/etc/postgresql-common/createcluster.conf"
    say "installing into $ROOT: $(echo $PACKAGES)"
    # shellcheck disable=SC2086
    (in_root /bin/sh -c "apt-get update && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends $(echo $PACKAGES) && apt-get clean") \
        >>"$ROOT.log" 2>&1 ||
        { tail -n 20 "$ROOT.log" >&2; die "apt-get in $ROOT failed (log: $ROOT.log)"; }
    stamp_text >"$STAMP"
    say "root ready in $((SECONDS - t0))s"
}

case ${1:-} in
    ensure) ensure ;;
    path) echo "$ROOT" ;;
    run) shift; [ $# -gt 0 ] || die "run: no command"; in_root "$@" ;;
    *) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
