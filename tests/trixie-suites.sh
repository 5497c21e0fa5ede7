#!/usr/bin/env bash
# tests/trixie-suites.sh BUILD_DIR - sekali built and tested with Debian 13's
# toolchain and libraries: gcc 14, OpenSSL 3.5, libpq 17, hiredis 1.2 and
# librabbitmq 0.15 (which fixes frame-decoding bugs that Debian 12's 0.11
# has), from the root of tests/debian13-root.sh.
#
# Builds BUILD_DIR inside the root with -Werror, then runs there the unit
# suites and the integration suites of the AMQP path against the servers
# tests/servers.sh started (their settings are read here, on the host, and
# passed in; the repository and the servers' scratch directory are shown
# inside at their own paths). The suites that drive rabbitmqctl, node or
# python are left to the Debian 12 build: the root has none of those.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/trixie}

UNIT_SKIP='check_docs'   # mandoc and promtool are not in the root
INTEGRATION='check_frames check_pipeline check_outcomes check_letters check_lock
check_dlq check_cancel check_nodes check_counts check_retention'

tests/debian13-root.sh ensure
eval "$(tests/servers.sh env)"
export SEKALI_BUILD="$PWD/$build" PGOPTIONS="-c client_min_messages=warning"
root_run() {
    SEKALI_ROOT_BIND="$PWD:$SEKALI_SCRATCH" SEKALI_ROOT_CWD="$PWD" tests/debian13-root.sh run "$@"
}

echo "== building $build in the Debian 13 root"
root_run sh -c "gcc --version | head -n 1; make -j2 B='$build' tests >'$build.log' 2>&1" ||
    { tail -n 30 "$build.log"; echo "trixie-suites: the build failed (log: $build.log)"; exit 1; }
conf="$SEKALI_SCRATCH/trixie-migrate.yaml"
printf 'amqp:\n  url: "%s"\npostgres:\n  conninfo: "%s"\nqueues:\n  - name: migrate\n    handler: unused.so\n' \
    "$SEKALI_AMQP_URL" "$SEKALI_PG_CONNINFO" >"$conf"
root_run sh -c "'$build/sekalictl' -c '$conf' migrate --sql-dir sql >/dev/null &&
    psql -q -v ON_ERROR_STOP=1 \"\$SEKALI_PG_CONNINFO\" -f tests/data/effects.sql >/dev/null"
dpkg_v() { root_run dpkg-query -W -f='${Version}' "$1"; }
echo "   librabbitmq $(dpkg_v librabbitmq4), OpenSSL $(dpkg_v libssl3t64), libpq $(dpkg_v libpq5)"

suites=()
for bin in "$build"/tests/check_*; do
    name=${bin##*/}
    case "$name" in *.d) continue ;; esac
    [ -f "tests/unit/$name.c" ] || continue
    case " $UNIT_SKIP " in *" $name "*) continue ;; esac
    suites+=("$name")
done
suites+=($INTEGRATION)

# Each suite prints check's "NN%: Checks: N, Failures: N, Errors: N".
root_run bash -c '
    passed=0 failed=0 bad=()
    for s in "$@"; do
        echo "== $s"
        out=$("$SEKALI_BUILD/tests/$s" 2>&1) || true
        printf "%s\n" "$out" | grep -E "^[^:]+:[0-9]+:[FE]:|Checks:" || true
        sum=$(printf "%s\n" "$out" | grep -oE "Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+" | tail -n 1)
        read -r n f e < <(printf "%s\n" "$sum" | grep -oE "[0-9]+" | tr "\n" " ")
        if [ -z "$sum" ]; then failed=$((failed + 1)); bad+=("$s (no summary)"); continue; fi
        passed=$((passed + n - f - e)); failed=$((failed + f + e))
        [ $((f + e)) -eq 0 ] || bad+=("$s")
    done
    echo "trixie: $passed passed, $failed failed"
    for b in "${bad[@]}"; do echo "FAILED $b"; done
    [ "$failed" -eq 0 ]' trixie "${suites[@]}"
