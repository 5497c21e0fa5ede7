#!/usr/bin/env bash
# Installs what building and testing sekali needs from Debian, if missing.
# Safe to run again: it asks apt only when a package is not installed.
set -euo pipefail

packages=(
    build-essential pkg-config
    librabbitmq-dev libhiredis-dev libpq-dev libyaml-dev libsystemd-dev libmicrohttpd-dev check
    libssl-dev openssl  # TLS to Redis (hiredis has none here); servers.sh makes a test CA
    libcurl4-openssl-dev  # the stock HTTP handler (handlers/http.c)
    postgresql postgresql-client redis-server redis-sentinel rabbitmq-server  # sentinel: tests/cluster
    valgrind procps libfaketime systemd
    iproute2          # ip netns for the network faults, ss for the chaos soak's stop
    curl prometheus   # the metrics test scrapes with curl and checks with promtool
    mandoc man-db     # check_docs lints the man pages; check_handler_build finds them
    python3 python3-psycopg  # the README's Python producer is run by a test
    nodejs            # and its Node.js producer (node-postgres comes from npm, in the test)
    chromium          # make check-browser: the console in a real browser (puppeteer-core from npm)
    clang libfuzzer-14-dev libclang-rt-14-dev  # make fuzz: libFuzzer harnesses under ASan/UBSan
    debhelper dpkg-dev fakeroot lintian  # check_package builds debian/ and lints the .debs
)

# Debian's npm, unless the nodejs installed already brings one (NodeSource's
# does, and conflicts with Debian's npm package).
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}; run as root or install them" >&2
    exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian starts freshly installed servers when it can; sekali's tests run
# their own on private ports, so stop the system ones from starting at all.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
[ $created_policy -eq 1 ] && rm -f "$policy"
exit 0
