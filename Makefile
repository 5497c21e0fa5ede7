# sekali - plain GNU make. `make help` lists the targets.
#
# Objects are built twice: into $(B)/obj for the production binaries, and with
# -DSK_FAULTS into $(B)/fault for the fault-test build of sekalid, so that no
# production binary contains a failpoint.

PREFIX  ?= /usr/local
VERSION  = 0.1.0
DESTDIR ?=
B       ?= build

# One folder per layer, top to bottom (docs/internals.md; tests/unit/check_layers.c
# reads a module's layer from its folder). Headers are found by name, so a
# module moving between layers changes no #include.
SRC_DIRS = src/ctl src/supervisor src/worker src/producer src/shared src/config src/adapters src/base
vpath %.c $(SRC_DIRS)

PKGS    = librabbitmq hiredis libpq yaml-0.1 libsystemd libmicrohttpd openssl
CC     ?= cc
CFLAGS ?= -O2 -g
# The caller's CFLAGS before sekali's are added: what handlers are built with.
USER_CFLAGS := $(CFLAGS)
# What every build of sekali's sources needs, gcc's and the fuzzers' clang's.
SK_CFLAGS = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
            -fno-strict-aliasing -MMD -MP $(addprefix -iquote ,$(SRC_DIRS)) -Iinclude \
            $(shell pkg-config --cflags $(PKGS)) \
            -DSK_SQL_DIR='"$(PREFIX)/share/sekali/sql"' -DSK_VERSION='"$(VERSION)"' \
            -DSK_HANDLER_DIR='"$(PREFIX)/lib/sekali/handlers"'
# The hardening the Debian package gets from dpkg-buildflags, by default:
# stack protector, _FORTIFY_SOURCE=2 (which needs an optimising build, so
# only with -O1 and up, and replaces a level the caller set), full RELRO
# and immediate binding. Not for the fuzzers' clang build (FUZZ_CFLAGS),
# where the sanitizers check more than fortify would. HARDEN= turns it off.
HARDEN    ?= 1
ifeq ($(HARDEN),1)
HARDEN_CFLAGS = -fstack-protector-strong -fstack-clash-protection \
                $(if $(filter -O1 -O2 -O3 -Os -Og -Ofast,$(USER_CFLAGS)),-U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=2)
HARDEN_LD     = -Wl,-z,relro -Wl,-z,now
endif
override CFLAGS += $(SK_CFLAGS) $(HARDEN_CFLAGS)
LDLIBS  = $(shell pkg-config --libs $(PKGS)) -ldl -lpthread $(HARDEN_LD)
CHECK_LIBS = $(shell pkg-config --libs check)
# sekalid's workers export spans over OTLP/HTTP (span_export.c): Debian's libcurl.
DAEMON_LIBS = $(LDLIBS) $(shell pkg-config --libs libcurl)
# sekalictl serve is the console (libmicrohttpd, threads); doctor asks Redis
# (hiredis); TLS is OpenSSL's.
CTL_LIBS = $(shell pkg-config --libs librabbitmq hiredis libpq yaml-0.1 libsystemd libmicrohttpd openssl) \
           -lm -lpthread $(HARDEN_LD)

CORE    = common text file lane trace_context config config_walk config_servers config_tracing config_queues config_schedules config_where config_value pg_conninfo log backoff clock outage broker_url tls cron tz ticks
# The broker module (broker.h) is one file per responsibility: see broker.c.
BROKER  = broker broker_queue broker_consume broker_scan broker_publish broker_wire
DAEMON  = $(CORE) main proctitle process supervisor generation deaths roles worker job job_state span span_lock span_commit span_blame span_settle limit batch batch_size job_trace span_export otlp_json links forward pause $(BROKER) envelope lock rate redis_link heartbeat pg store plugin host sqlq headers_json letter failpoint reschedule scoreboard lease \
          doctor doctor_report doctor_broker doctor_servers doctor_schedules doctor_versions doctor_pages \
          notify oom metrics metrics_text metrics_http inflight relay janitor history scheduler schema
CTL     = $(CORE) ctl ctl_common ctl_delays ctl_pool ctl_migrate ctl_migrate_online ctl_migrate_plan ctl_migrate_scan ctl_enqueue ctl_dlq ctl_dlq_read ctl_dlq_import ctl_out ctl_status ctl_trace ctl_fingerprint ctl_http ctl_doctor ctl_verify ctl_schedules ctl_scheduled ctl_inflight ctl_pause ctl_cancel \
          console console_http console_auth console_guard console_api console_rates console_history console_assets $(BROKER) pg envelope failpoint reschedule schema doctor doctor_report doctor_broker doctor_servers doctor_schedules doctor_versions doctor_pages redis_link

obj   = $(patsubst %,$(B)/obj/%.o,$(1))
fobj  = $(patsubst %,$(B)/fault/%.o,$(1))

# The example (examples/) and the stock handlers (handlers/), which a bare
# `handler: NAME` selects from $(HANDLERDIR).
HANDLERS     = $(B)/handlers/invoice.so $(B)/handlers/sql.so $(B)/handlers/http.so
TEST_PLUGINS = $(patsubst tests/plugins/%.c,$(B)/tests/plugins/%.so,$(wildcard tests/plugins/*.c))
UNIT_TESTS   = $(patsubst tests/unit/%.c,$(B)/tests/%,$(wildcard tests/unit/check_*.c))
INTEG_TESTS  = $(patsubst tests/integration/%.c,$(B)/tests/%,$(wildcard tests/integration/check_*.c))
FAULT_TESTS  = $(patsubst tests/fault/%.c,$(B)/tests/%,$(wildcard tests/fault/check_*.c))
# The console in a real browser (make check-browser): not in TESTS, since it
# needs chromium and the npm registry.
BROWSER_TESTS = $(patsubst tests/browser/%.c,$(B)/tests/%,$(wildcard tests/browser/check_*.c))
TESTS        = $(UNIT_TESTS) $(INTEG_TESTS) $(FAULT_TESTS)
CHAOS        = $(B)/chaos/chaos_producer

.PHONY: all tests check check-unit check-browser check-cluster check-today deps servers demo bench bench-distance bench-rate bench-otlp bench-fairness bench-scale bench-cluster chaos asan valgrind fuzz fuzzers \
        fuzz-seeds install clean help
all: $(B)/sekalid $(B)/sekalictl $(HANDLERS)

tests: all $(B)/fault/sekalid $(B)/fault/sekalictl $(TEST_PLUGINS) $(TESTS) $(CHAOS)

$(B)/sekalid: $(call obj,$(DAEMON))
	$(CC) $(CFLAGS) -o $@ $^ $(DAEMON_LIBS)
$(B)/fault/sekalid: $(call fobj,$(DAEMON))
	$(CC) $(CFLAGS) -DSK_FAULTS -o $@ $^ $(DAEMON_LIBS)
$(B)/sekalictl: $(call obj,$(CTL))
	$(CC) $(CFLAGS) -o $@ $^ $(CTL_LIBS)
$(B)/fault/sekalictl: $(call fobj,$(CTL))
	$(CC) $(CFLAGS) -DSK_FAULTS -o $@ $^ $(CTL_LIBS)

# The console's page, script and style, embedded in sekalictl: served from
# memory, nothing fetched from anywhere at run time.
CONSOLE_ASSETS = $(sort $(wildcard src/ctl/console/*))
$(B)/gen/console_assets.c: $(CONSOLE_ASSETS) tools/embed-assets.sh
	@mkdir -p $(B)/gen
	tools/embed-assets.sh $(CONSOLE_ASSETS) > $@.tmp && mv $@.tmp $@
$(B)/obj/console_assets.o: $(B)/gen/console_assets.c | $(B)/obj
	$(CC) $(CFLAGS) -c -o $@ $<
$(B)/fault/console_assets.o: $(B)/gen/console_assets.c | $(B)/fault
	$(CC) $(CFLAGS) -DSK_FAULTS -c -o $@ $<

$(B)/obj/%.o: %.c | $(B)/obj
	$(CC) $(CFLAGS) -c -o $@ $<
$(B)/fault/%.o: %.c | $(B)/fault
	$(CC) $(CFLAGS) -DSK_FAULTS -c -o $@ $<

# Handlers are built exactly as a handler author would: against the public
# header only (no -iquote src, no daemon defines), position-independent, with
# no daemon symbols. HANDLER_CFLAGS is the one given to authors, so a handler
# that reaches for a private header fails here first. The caller's CFLAGS
# (optimisation, sanitizers) still apply, but never the daemon's own flags.
HANDLER_CFLAGS = -std=c11 -Wall -Wextra -Werror -Iinclude $(shell pkg-config --cflags libpq)
# The handlers sekali ships run inside sekalid: they get its hardening too.
$(B)/handlers/%.so: examples/%.c include/sekali/handler.h | $(B)/handlers
	$(CC) $(USER_CFLAGS) $(HANDLER_CFLAGS) $(HARDEN_CFLAGS) -fPIC -shared -o $@ $< \
	    $(shell pkg-config --libs libpq) $(HARDEN_LD)
$(B)/handlers/%.so: handlers/%.c include/sekali/handler.h | $(B)/handlers
	$(CC) $(USER_CFLAGS) $(HANDLER_CFLAGS) $(HARDEN_CFLAGS) $(HANDLER_PKGS_CFLAGS) -fPIC \
	    -shared -o $@ $< $(shell pkg-config --libs libpq) $(HANDLER_PKGS_LIBS) $(HARDEN_LD)
# The HTTP handler's own libraries: Debian's libcurl, and libyaml for its
# nested `headers:` mapping.
$(B)/handlers/http.so: HANDLER_PKGS_CFLAGS = $(shell pkg-config --cflags libcurl yaml-0.1)
$(B)/handlers/http.so: HANDLER_PKGS_LIBS = $(shell pkg-config --libs libcurl yaml-0.1)
# It opens its secret and TLS files with src/base/file.c compiled in, all
# but its one exported symbol hidden: the daemon's check of a configured
# file, never a daemon symbol.
$(B)/handlers/http.so: handlers/http.c src/base/file.c src/base/file.h include/sekali/handler.h \
                       | $(B)/handlers
	$(CC) $(USER_CFLAGS) $(HANDLER_CFLAGS) $(HARDEN_CFLAGS) $(HANDLER_PKGS_CFLAGS) \
	    -D_POSIX_C_SOURCE=200809L -iquote src/base -fvisibility=hidden -fPIC -shared -o $@ \
	    handlers/http.c src/base/file.c $(shell pkg-config --libs libpq) $(HANDLER_PKGS_LIBS) \
	    $(HARDEN_LD)
$(B)/tests/plugins/%.so: tests/plugins/%.c include/sekali/handler.h | $(B)/tests/plugins
	$(CC) $(USER_CFLAGS) $(HANDLER_CFLAGS) -fPIC -shared -o $@ $< \
	    $(shell pkg-config --libs libpq)

# Each unit suite links only the module it tests, plus the core: by default
# the core and the module its name gives (check_cron: $(CORE) and cron, if
# src/ has one). A suite that needs other modules names them all in a
# comment line of its own, `/* links: core deaths oom scoreboard */`, where
# "core" and "broker" stand for those lists and "none" for nothing; so a new
# suite needs no line here.
UNIT_LINKS = $(shell sed -n 's|^/\* links: \(.*\) \*/$$|\1|p' tests/unit/$(1).c)
unit_default = core $(if $(wildcard $(addsuffix /$(1:check_%=%).c,$(SRC_DIRS))),$(1:check_%=%))
unit_mods = $(sort $(patsubst core,$(CORE),$(patsubst broker,$(BROKER),$(filter-out none,$(or \
            $(call UNIT_LINKS,$(1)),$(call unit_default,$(1)))))))
$(foreach t,$(UNIT_TESTS:$(B)/tests/%=%),$(eval $(B)/tests/$(t): $(call obj,$(call unit_mods,$(t)))))
# check_layers reads every object's symbols (nm): built first, not linked.
$(B)/tests/check_layers: | $(call obj,$(sort $(DAEMON) $(CTL)))
$(B)/tests/check_%: tests/unit/check_%.c | $(B)/tests
	$(CC) $(CFLAGS) -iquote tests -o $@ $(filter %.c %.o,$^) $(LDLIBS) $(CHECK_LIBS)

# The harness of the integration and fault suites: harness.h over one file
# per responsibility (tests/harness_*.c). A static pattern rule, so that its
# objects are explicit targets, which make keeps (an implicit rule's would be
# intermediate: deleted after the link and built again by the next make).
HARNESS_OBJ = $(patsubst tests/%.c,$(B)/obj/%.o,$(wildcard tests/harness_*.c))
HARNESS = $(call obj,$(CORE) $(BROKER) lock redis_link) $(HARNESS_OBJ)
$(HARNESS_OBJ): $(B)/obj/%.o: tests/%.c | $(B)/obj
	$(CC) $(CFLAGS) -iquote tests -c -o $@ $<
$(B)/tests/check_pg: $(call obj,pg)
# The janitor's history writer, run in the suite's process.
$(B)/tests/check_history: $(call obj,history metrics pg)
$(B)/tests/check_http_handler: tests/http_server.c tests/http_server.h
$(B)/tests/check_tracing: tests/http_server.c tests/http_server.h
# The far PostgreSQL of check_distance: the benchmark's delay proxy.
$(B)/tests/check_distance: | $(B)/tests/delay_proxy
$(B)/tests/check_redis_stall: | $(B)/tests/delay_proxy
$(B)/tests/delay_proxy: tests/bench/delay_proxy.c | $(B)/tests
	$(CC) $(CFLAGS) -o $@ $<
$(B)/tests/check_%: tests/integration/check_%.c $(HARNESS) | $(B)/tests
	$(CC) $(CFLAGS) -iquote tests -o $@ $(filter %.c %.o,$^) $(LDLIBS) $(CHECK_LIBS)
$(B)/tests/check_%: tests/browser/check_%.c $(HARNESS) | $(B)/tests
	$(CC) $(CFLAGS) -iquote tests -o $@ $(filter %.c %.o,$^) $(LDLIBS) $(CHECK_LIBS)
$(B)/tests/check_%: tests/fault/check_%.c $(HARNESS) | $(B)/tests
	$(CC) $(CFLAGS) -iquote tests -o $@ $(filter %.c %.o,$^) $(LDLIBS) $(CHECK_LIBS)

# libFuzzer harnesses (tests/fuzz/), built by clang under ASan and UBSan in a
# tree of their own: the gcc objects above are not instrumented for coverage.
FUZZ_CC      ?= clang
FUZZ_B        = $(B)/fuzz
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS   = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=all $(SK_CFLAGS)
FUZZERS       = $(patsubst tests/fuzz/%.c,$(FUZZ_B)/%,$(wildcard tests/fuzz/fuzz_*.c))
zobj          = $(patsubst %,$(FUZZ_B)/obj/%.o,$(1))

$(FUZZ_B)/fuzz_config:   $(call zobj,$(CORE))
$(FUZZ_B)/fuzz_envelope: $(call zobj,$(CORE) envelope $(BROKER))
$(FUZZ_B)/fuzz_values:   $(call zobj,$(CORE))
$(FUZZ_B)/fuzz_text:     $(call zobj,$(CORE))
$(FUZZ_B)/fuzz_trace_context: $(call zobj,$(CORE))
$(FUZZ_B)/fuzz_ctl_out:  $(call zobj,ctl_out broker_wire text)
$(FUZZ_B)/fuzz_%: tests/fuzz/fuzz_%.c | $(FUZZ_B)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $(filter %.c %.o,$^) $(LDLIBS)
$(FUZZ_B)/obj/%.o: %.c | $(FUZZ_B)/obj
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<
$(FUZZ_B)/envelope_seeds: tests/fuzz/envelope_seeds.c | $(FUZZ_B)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

fuzzers: $(FUZZERS)

# Each harness for FUZZ_SECONDS; fails on any finding, whose input is kept
# under $(FUZZ_B)/artifacts/.
fuzz: deps
	$(MAKE) fuzzers
	FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_B)

# Rewrites the envelope seeds in the source tree (they are committed).
fuzz-seeds: $(FUZZ_B)/envelope_seeds
	mkdir -p tests/fuzz/corpus/envelope
	$(FUZZ_B)/envelope_seeds tests/fuzz/corpus/envelope

# The chaos soak's producer (tests/chaos/run.sh), a plain librabbitmq client.
$(B)/chaos/chaos_producer: tests/chaos/chaos_producer.c | $(B)/chaos
	$(CC) $(CFLAGS) -o $@ $< $(shell pkg-config --libs librabbitmq)

$(B)/obj $(B)/fault $(B)/handlers $(B)/tests $(B)/tests/plugins $(B)/chaos $(FUZZ_B) \
$(FUZZ_B)/obj:
	mkdir -p $@

# The README's two commands. Both install what is missing first, then build
# in a sub-make, so that pkg-config sees the freshly installed libraries.
deps:
	tools/install-deps.sh
servers:
	tests/servers.sh start

# SEKALI_TLS=1: the servers also listen with TLS, for check_tls, which
# SEKALI_REQUIRE_TLS keeps from passing without them.
check: deps
	$(MAKE) tests fuzzers
	SEKALI_TLS=1 tests/servers.sh start
	SEKALI_REQUIRE_TLS=1 tests/run.sh $(B)

check-unit: tests
	tests/run.sh $(B) unit

# The console (sekalictl serve) in Debian's chromium, driven by puppeteer-core
# from the npm registry (tests/browser/); screenshots and timings land in
# $(B)/artifacts/console.
check-browser: deps
	$(MAKE) tests $(BROWSER_TESTS)
	SEKALI_TLS=1 tests/servers.sh start
	tests/run.sh $(B) browser

# The cluster suites (tests/cluster/): a RabbitMQ cluster, PostgreSQL
# failover; each test starts, stops and wipes its own servers.
check-cluster: deps
	$(MAKE) tests
	tests/cluster/run.sh $(B)

# Today's servers: RabbitMQ 4, Valkey and PostgreSQL 17 from a Debian 13 root
# (tests/debian13-root.sh: debootstrap, minutes the first time), for the
# suites where the servers' behaviour matters: integration, fault and the
# RabbitMQ leader loss; then sekali built there too, with Debian 13's gcc,
# OpenSSL and librabbitmq 0.15, and its unit and AMQP-path suites run. The
# Debian 12 servers of the other targets are restarted as these by
# servers.sh, and back again by the next `make check`.
check-today: deps
	$(MAKE) tests
	SEKALI_RABBITMQ=4 SEKALI_REDIS=valkey SEKALI_PG=17 tests/debian13-root.sh ensure
	SEKALI_RABBITMQ=4 SEKALI_REDIS=valkey SEKALI_PG=17 SEKALI_TLS=1 tests/servers.sh start
	SEKALI_RABBITMQ=4 SEKALI_REDIS=valkey SEKALI_PG=17 SEKALI_REQUIRE_TLS=1 \
	    tests/run.sh $(B) integration fault
	SEKALI_RABBITMQ=4 SEKALI_REDIS=valkey SEKALI_PG=17 tests/cluster/run.sh $(B) test_rabbitmq_leader
	SEKALI_RABBITMQ=4 SEKALI_REDIS=valkey SEKALI_PG=17 SEKALI_TLS=1 tests/servers.sh start
	SEKALI_RABBITMQ=4 SEKALI_REDIS=valkey SEKALI_PG=17 tests/trixie-suites.sh $(B)/trixie

demo: deps
	$(MAKE) all
	tests/servers.sh start
	DEMO_HANDLER=$(HANDLER) tools/demo.sh $(B)

bench: deps
	$(MAKE) all
	SEKALI_TLS=1 tests/servers.sh start
	tests/bench/run.sh $(B)
	tests/bench/enqueue.sh $(B)
	tests/bench/tls.sh $(B)

# Distance: jobs/s and p99 with 0, 2, 20 and 150 ms each way on every link,
# through tests/bench/delay_proxy.c (tests/bench/distance.sh; BENCH_*).
bench-distance: deps
	$(MAKE) all
	tests/servers.sh start
	tests/bench/distance.sh $(B)

# The cost of a rate limit per job, far above the rate (tests/bench/rate.sh;
# BENCH_*).
bench-rate: deps
	$(MAKE) all
	tests/servers.sh start
	tests/bench/rate.sh $(B)

# A light tenant's wait behind a heavy one's backlog with lanes and without,
# and the hop's cost (tests/bench/fairness.sh; BENCH_*).
bench-fairness: deps
	$(MAKE) all
	tests/servers.sh start
	tests/bench/fairness.sh $(B)

# The cost of exporting every run's span to a local OTLP receiver against
# none (tests/bench/otlp.sh; BENCH_*).
bench-otlp: deps
	$(MAKE) all
	tests/servers.sh start
	tests/bench/otlp.sh $(B)

# History at scale: jobs/s, the janitor and the operator's reads with 10 M
# retained keys against an empty store (tests/bench/scale.sh; BENCH_SCALE_*).
bench-scale: deps
	$(MAKE) all
	tests/servers.sh start
	tests/bench/scale.sh $(B)

# The scale figure: 1, 2 and 3 sekalid hosts in network namespaces, and a
# quorum queue against a classic one (root; its own private servers).
bench-cluster: deps
	$(MAKE) all $(CHAOS) $(TEST_PLUGINS)
	tests/cluster/bench_cluster.sh $(B)

# The long chaos soak (the short one runs in `make check`, check_chaos).
chaos: deps
	$(MAKE) all $(CHAOS) $(TEST_PLUGINS) $(B)/tests/delay_proxy
	tests/servers.sh start
	tests/chaos/run.sh $(B)

# ASan and UBSan over the whole suite, in a separate build tree.
asan: deps
	$(MAKE) B=build/asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" tests
	SEKALI_TLS=1 tests/servers.sh start
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    tests/run.sh build/asan unit integration fault

# Valgrind over the unit suites and over sekalid in the integration suites.
valgrind: deps
	$(MAKE) tests
	SEKALI_TLS=1 tests/servers.sh start
	SEKALI_VALGRIND=1 tests/run.sh $(B) unit integration fault

# Installs the daemon, the example handler, the header and a pkg-config file
# for handler authors, the migrations, the unit (with this PREFIX's paths),
# the man pages, the Grafana dashboard and alerting rules and, unless one
# exists, the example configuration.
BINDIR     = $(PREFIX)/bin
HANDLERDIR = $(PREFIX)/lib/sekali/handlers
INCLUDEDIR = $(PREFIX)/include
SQLDIR     = $(PREFIX)/share/sekali/sql
DOCDIR     = $(PREFIX)/share/doc/sekali
UNITDIR   ?= $(PREFIX)/lib/systemd/system
PCDIR      = $(PREFIX)/lib/pkgconfig
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
MANDIR     = $(PREFIX)/share/man
SHAREDIR   = $(PREFIX)/share/sekali
SYSCONFDIR ?= /etc
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(HANDLERDIR) $(DESTDIR)$(INCLUDEDIR)/sekali \
	    $(DESTDIR)$(SQLDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PCDIR)
	install -m 755 $(B)/sekalid $(B)/sekalictl $(DESTDIR)$(BINDIR)/
	install -m 644 $(HANDLERS) $(DESTDIR)$(HANDLERDIR)/
	install -m 644 include/sekali/handler.h $(DESTDIR)$(INCLUDEDIR)/sekali/
	install -m 644 sql/*.sql $(DESTDIR)$(SQLDIR)/
	install -m 644 README.md NEWS.md LICENSE $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(DOCDIR)/docs
	install -m 644 docs/*.md $(DESTDIR)$(DOCDIR)/docs/
	install -d $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man7 \
	    $(DESTDIR)$(MANDIR)/man8
	install -m 644 man/*.3 $(DESTDIR)$(MANDIR)/man3/
	install -m 644 man/*.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 644 man/*.7 $(DESTDIR)$(MANDIR)/man7/
	install -m 644 man/*.8 $(DESTDIR)$(MANDIR)/man8/
	install -d $(DESTDIR)$(SHAREDIR)/grafana $(DESTDIR)$(SHAREDIR)/prometheus
	install -m 644 contrib/grafana/sekali.json $(DESTDIR)$(SHAREDIR)/grafana/
	install -m 644 contrib/prometheus/sekali-rules.yml $(DESTDIR)$(SHAREDIR)/prometheus/
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	    -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' systemd/sekali.service.in \
	    > $(DESTDIR)$(UNITDIR)/sekali.service
	chmod 644 $(DESTDIR)$(UNITDIR)/sekali.service
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' sekali.pc.in \
	    > $(DESTDIR)$(PCDIR)/sekali.pc
	install -d $(DESTDIR)$(SYSUSERSDIR)
	install -m 644 systemd/sekali.sysusers $(DESTDIR)$(SYSUSERSDIR)/sekali.conf
	@# The unit runs as sekali, which must read the configuration (and any
	@# password_file): onto this machine, as root, the account is made here;
	@# a package (DESTDIR) gets it from the sysusers.d file above.
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && ! getent passwd sekali >/dev/null; then \
	    echo "make install: creating system user and group sekali"; \
	    useradd --system --user-group --no-create-home --home-dir /nonexistent \
	        --shell /usr/sbin/nologin --comment "sekali worker daemon" sekali; \
	fi
	install -d $(DESTDIR)$(SYSCONFDIR)/sekali
	@# root:sekali 0640: the service reads it, only root changes it.
	@conf=$(DESTDIR)$(SYSCONFDIR)/sekali/sekali.yaml; \
	if [ ! -e "$$conf" ]; then \
	    sed -e 's|/usr/local/lib/sekali/handlers/|$(HANDLERDIR)/|' conf/sekali.yaml > "$$conf.new" && \
	    chmod 640 "$$conf.new" && \
	    { chgrp sekali "$$conf.new" 2>/dev/null || \
	      echo "make install: no group sekali here: chgrp sekali $(SYSCONFDIR)/sekali/sekali.yaml" \
	           "on the target, or the service cannot read it" >&2; } && \
	    mv "$$conf.new" "$$conf"; \
	fi

clean:
	rm -rf build

help:
	@echo "all       sekalid, sekalictl and the example handlers (in $(B)/)"
	@echo "check     install what is missing, start test servers, run every test"
	@echo "demo      install what is missing, start servers, run sekalid on duplicate jobs"
	@echo "          (HANDLER=sql: through the stock SQL handler instead of the C example)"
	@echo "bench     throughput and latency against pgbench on the same SQL; enqueue rate"
	@echo "          against a raw INSERT, outbox-to-effect latency against direct publish"
	@echo "bench-distance  jobs/s and p99 with 0, 2, 20, 150 ms each way to every server"
	@echo "          (a delaying proxy), at the defaults and at batch 1"
	@echo "bench-rate  jobs/s with a rate limit far above the rate against none (its cost)"
	@echo "bench-otlp  jobs/s and CPU per job exporting every span over OTLP/HTTP against none"
	@echo "bench-fairness  light tenants' wait behind a heavy backlog, lanes 0 and 8; the hop's cost"
	@echo "bench-scale  jobs/s, janitor and operator reads with 10 M retained keys vs none"
	@echo "bench-cluster  jobs/s with 1, 2, 3 sekalid hosts (network namespaces); quorum vs classic"
	@echo "chaos     the chaos soak: 20,000 keys (30% published twice) on 4 workers, a worker"
	@echo "          SIGKILLed every 100-200 ms, a worker SIGSTOPped past its lock, Redis,"
	@echo "          RabbitMQ and PostgreSQL restarted; fails on any doubled or lost key"
	@echo "          (CHAOS_* settings: see tests/chaos/run.sh); CHAOS_LATENCY=150:900: ms each"
	@echo "          way to PostgreSQL:Redis for a window of the storm, through a delay proxy;"
	@echo "          CHAOS_CONCURRENCY=N: a queue concurrency, checked (<= N of a resource at once)"
	@echo "check-browser  the console (sekalictl serve) in Debian's chromium via puppeteer-core:"
	@echo "          replay, purge, key search, hostile data, refused requests; screenshots"
	@echo "          and render times in $(B)/artifacts/console"
	@echo "check-cluster  the cluster suites (tests/cluster/): a 3-node RabbitMQ cluster losing"
	@echo "          its queue's leader, PostgreSQL failing over to a sync and an async standby"
	@echo "check-today  integration, fault and leader-loss suites on RabbitMQ 4, Valkey and"
	@echo "          PostgreSQL 17 from a Debian 13 root (tests/debian13-root.sh; root)"
	@echo "asan      the test suite under ASan and UBSan"
	@echo "valgrind  the test suite with sekalid under valgrind"
	@echo "fuzz      each libFuzzer harness for FUZZ_SECONDS=$(FUZZ_SECONDS) (clang, ASan, UBSan)"
	@echo "install   PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)"
	@echo "SEKALI_RABBITMQ=4 SEKALI_REDIS=valkey SEKALI_PG=17 before demo, check, check-cluster,"
	@echo "          bench or chaos: Debian 13's servers, from a root made once by"
	@echo "          tests/debian13-root.sh (root; debootstrap; docs/operations.md)"

-include $(shell find $(B) -name '*.d' 2>/dev/null)
