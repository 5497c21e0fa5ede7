#!/usr/bin/env bash
# Runs the test suites against the servers of tests/servers.sh.
#   tests/run.sh BUILD_DIR [unit|integration|fault|fuzz ...]
# Prepares the database (schema migrations, the test handler's table), runs
# each check suite, and ends with one line "N passed, N failed" over all of them.
# The fuzz kind runs each libFuzzer harness of BUILD_DIR/fuzz (make fuzzers)
# for FUZZ_SECONDS, 20 unless set, and counts each harness as one check.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(unit integration fault fuzz)

eval "$(tests/servers.sh env)"
export PGOPTIONS="-c client_min_messages=warning"
export SEKALI_BUILD="$PWD/$build"

needs_servers=0
for kind in "${kinds[@]}"; do [ "$kind" != unit ] && [ "$kind" != fuzz ] && needs_servers=1; done
if [ $needs_servers -eq 1 ]; then
    mkdir -p "$SEKALI_SCRATCH/tests"
    conf="$SEKALI_SCRATCH/tests/migrate.yaml"
    cat > "$conf" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
postgres:
  conninfo: "$SEKALI_PG_CONNINFO"
queues:
  - name: migrate
    handler: unused.so
YAML
    "$build/sekalictl" -c "$conf" migrate --sql-dir sql >/dev/null || exit 1
    psql -q -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" -f tests/data/effects.sql >/dev/null || exit 1
fi

passed=0 failed=0
# What failed, repeated after the totals: CI shows only the tail of the log.
failures=()
# run_suite KIND NAME [LABEL]: one suite binary, its checks added to the totals.
run_suite() {
    local kind=$1 name=$2 label=${3:-}
    local bin="$build/tests/$name" out rc summary n f
    echo "== $kind/$name${label:+ ($label)}"
    if [ "$kind" = unit ] && [ -n "${SEKALI_VALGRIND:-}" ]; then
        out=$(CK_FORK=no valgrind -q --error-exitcode=99 --leak-check=full --child-silent-after-fork=yes \
              --errors-for-leak-kinds=definite "$bin" 2>&1)
    else
        out=$("$bin" 2>&1)
    fi
    rc=$?
    printf '%s\n' "$out"
    # check prints "file:line:F:tcase:test:i: message" (E for an error) per failed check.
    local line
    while IFS= read -r line; do
        failures+=("$kind/$name${label:+ ($label)}: $line")
    done < <(printf '%s\n' "$out" | grep -E '^[^:]+:[0-9]+:[FE]:' || true)
    # check prints "NN%: Checks: N, Failures: N, Errors: N" per suite.
    summary=$(printf '%s\n' "$out" | grep -oE '[0-9]+%: Checks: .*' | tail -n 1)
    if [ -z "$summary" ]; then
        echo "$name: no check summary (exit $rc)"; failed=$((failed + 1))
        failures+=("$kind/$name: no check summary (exit $rc)"); return
    fi
    n=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$summary")
    f=$(sed -E 's/.*Failures: ([0-9]+), Errors: ([0-9]+).*/\1+\2/' <<<"$summary")
    f=$((f))
    passed=$((passed + n - f)); failed=$((failed + f))
    if [ $rc -ne 0 ] && [ $f -eq 0 ]; then
        echo "$name: exited $rc (valgrind or a crash outside a test)"; failed=$((failed + 1))
        failures+=("$kind/$name: exited $rc (valgrind or a crash outside a test)")
    fi
}

for kind in "${kinds[@]}"; do
    if [ "$kind" = fuzz ]; then
        for src in tests/fuzz/fuzz_*.c; do
            name=$(basename "$src" .c)
            echo "== fuzz/$name"
            if FUZZ_SECONDS=${FUZZ_SECONDS:-20} tests/fuzz/run.sh "$build/fuzz" "${name#fuzz_}"; then
                passed=$((passed + 1))
            else
                failed=$((failed + 1)); failures+=("fuzz/$name: failed")
            fi
        done
        continue
    fi
    for src in tests/"$kind"/check_*.c; do
        [ -e "$src" ] || continue
        run_suite "$kind" "$(basename "$src" .c)"
    done
    # The fault suites that matter over TLS once more with TLS on every link
    # (SEKALI_TEST_TLS, see tests/README.md): a worker killed mid-job and the
    # servers' restarts, whose reconnects are new TLS handshakes. They need
    # the TLS listeners; SEKALI_REQUIRE_TLS (make check) makes their absence
    # a failure.
    if [ "$kind" = fault ] && [ "${SEKALI_TLS_RERUN:-1}" = 1 ]; then
        if [ -n "${SEKALI_TLS_DIR:-}" ]; then
            for name in check_crash check_outages; do
                SEKALI_TEST_TLS=1 run_suite fault "$name" TLS
            done
        elif [ -n "${SEKALI_REQUIRE_TLS:-}" ]; then
            echo "fault (TLS): the servers have no TLS listeners (SEKALI_TLS=1 tests/servers.sh start)"
            failed=$((failed + 1)); failures+=("fault (TLS): no TLS listeners")
        else
            echo "fault (TLS): skipped, the servers have no TLS listeners (SEKALI_TLS=1 tests/servers.sh start)"
        fi
    fi
done
echo "$passed passed, $failed failed"
for line in "${failures[@]}"; do echo "FAILED $line"; done
[ $failed -eq 0 ]
