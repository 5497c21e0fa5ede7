#!/usr/bin/env bash
# Runs the libFuzzer harnesses built by `make fuzzers`.
#   tests/fuzz/run.sh FUZZ_BUILD_DIR [config|envelope|values ...]
# Each runs for FUZZ_SECONDS (default 60) from its seeds, tests/fuzz/corpus/
# NAME (and tests/data for config), read-only; what it learns goes to
# FUZZ_BUILD_DIR/corpus/NAME and a finding's input to
# FUZZ_BUILD_DIR/artifacts/NAME/, never into the source tree. Prints one line
# per harness with libFuzzer's execution count, the full log of a failing
# one, and exits non-zero on any finding (crash, sanitizer report, leak,
# timeout, out of memory) or if a harness does not run.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: tests/fuzz/run.sh FUZZ_BUILD_DIR [NAME ...]}
shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for src in tests/fuzz/fuzz_*.c; do names+=("$(basename "$src" .c | sed 's/^fuzz_//')"); done
fi
seconds=${FUZZ_SECONDS:-60}

# Sanitizer reports are findings: stop at the first, with a stack.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1

summary=() failed=0
for name in "${names[@]}"; do
    bin=$dir/fuzz_$name
    work=$dir/corpus/$name
    art=$dir/artifacts/$name
    log=$dir/logs/$name.log
    mkdir -p "$work" "$art" "$dir/logs"
    seeds=(tests/fuzz/corpus/"$name")
    [ "$name" = config ] && seeds+=(tests/data)
    opts=(-max_total_time="$seconds" -timeout=10 -artifact_prefix="$art/")
    [ -e tests/fuzz/"$name".dict ] && opts+=(-dict=tests/fuzz/"$name".dict)
    # stdin is /dev/null: a config may name /dev/stdin as its password_file.
    "$bin" "${opts[@]}" "$work" "${seeds[@]}" </dev/null >"$log" 2>&1
    rc=$?
    done_line=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1)
    runs=$(sed -E 's/Done ([0-9]+) runs in ([0-9]+).*/\1 runs in \2 s/' <<<"$done_line")
    if [ $rc -eq 0 ] && [ -n "$done_line" ]; then
        echo "fuzz $name: ok, $runs"
        summary+=("$name $runs")
        continue
    fi
    failed=$((failed + 1))
    cat "$log"
    artefact=$(grep -oE 'Test unit written to .*' "$log" | sed 's/^Test unit written to //' | tail -n 1)
    echo "fuzz $name: FAILED (exit $rc)${artefact:+, input in $artefact}; log in $log"
    summary+=("$name FAILED")
done
[ ${#names[@]} -gt 1 ] && (IFS=';'; echo "fuzz summary (${seconds} s each):${summary[*]/#/ }")
[ $failed -eq 0 ]
