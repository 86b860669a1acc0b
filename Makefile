# redpacket: PGXS build and test wiring.
#
#   make && sudo make install        build and install into the pg_config below
#   make installcheck                pg_regress, isolation and TAP suites, each on
#                                    its own temporary instance (run as a non-root user)
#   make stress / make bench         concurrency stress run / benchmark suite
#   make bench-group                 group red packets alone (test/bench/group.sh)
#   make bench-citus                 rp_claim on a Citus cluster vs a single node

MODULE_big = redpacket
# src/ by subsystem, bottom up: each folder uses only the ones before it,
# through the header named after it.
RP_SUBSYSTEMS = base ops scaleout claim reconcile campaign
OBJS = src/redpacket.o \
       $(patsubst %.c,%.o,$(sort $(wildcard $(addprefix src/,$(addsuffix /*.c,$(RP_SUBSYSTEMS))))))

EXTENSION = redpacket
DATA = sql/redpacket--1.0.sql sql/redpacket--1.1.sql sql/redpacket--1.2.sql \
       sql/redpacket--1.3.sql sql/redpacket--1.4.sql sql/redpacket--1.5.sql \
       sql/redpacket--1.6.sql sql/redpacket--1.7.sql \
       sql/redpacket--1.0--1.1.sql sql/redpacket--1.1--1.2.sql \
       sql/redpacket--1.2--1.3.sql sql/redpacket--1.3--1.4.sql \
       sql/redpacket--1.4--1.5.sql sql/redpacket--1.5--1.6.sql \
       sql/redpacket--1.6--1.7.sql
PGFILEDESC = "redpacket - lucky-money claims enforced in the database"

# The PostgreSQL to build for: the pg_config on the PATH (on Debian the
# newest installed server-dev), or PG_CONFIG=... for another major, e.g.
# PG_CONFIG=test/pg18/build/install/bin/pg_config (test/pg18/build.sh).
PG_CONFIG ?= pg_config

PG_CPPFLAGS += -I$(srcdir)/src
PG_CFLAGS += -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare \
             -Wno-missing-field-initializers

# Every sql/*.sql except install scripts is a regression test; every
# test/specs/*.spec an isolation test; every test/t/*.pl a TAP test.
REGRESS = $(sort $(patsubst sql/%.sql,%,$(filter-out sql/redpacket--%,$(wildcard sql/*.sql))))
REGRESS_OPTS = --load-extension=redpacket --temp-instance=./tmp_check \
               --temp-config=test/regress.conf
# TEMP_CONFIG (as for PostgreSQL's own tests): a file of extra settings for
# the temporary instances, e.g. test/spi_path.conf in test/run_all.sh.
ifdef TEMP_CONFIG
REGRESS_OPTS += --temp-config=$(TEMP_CONFIG)
endif
ISOLATION = $(sort $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --load-extension=redpacket --inputdir=test --outputdir=test/output_iso \
                 --temp-instance=./tmp_check_iso --temp-config=test/regress.conf
ifdef TEMP_CONFIG
ISOLATION_OPTS += --temp-config=$(TEMP_CONFIG)
endif
TAP_TESTS = 1
PROVE_TESTS = $(sort $(wildcard test/t/*.pl))

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# the TAP tests' own Perl module (test/perl/RedpacketTest.pm)
PG_PROVE_FLAGS += -I $(srcdir)/test/perl

.PHONY: stress bench bench-group bench-citus demo
stress:
	bash test/stress/run.sh
bench:
	bash test/bench/run.sh
# many small activities and the reconciler keeping up (also part of bench)
bench-group:
	PG_CONFIG=$(PG_CONFIG) bash test/bench/group.sh
# rp_claim through a Citus coordinator, on a worker and on a single node
# (needs Citus installed: test/citus/build.sh)
bench-citus:
	PG_CONFIG=$(PG_CONFIG) bash test/bench/citus.sh
demo:
	bash test/demo.sh

# Every object depends on the headers.
$(OBJS): $(wildcard src/*/*.h)

# The allocator's own tests: a program built from src/claim/alloc.c alone,
# for tests only (never installed).
.PHONY: alloc-test
test/alloc/plan_test: test/alloc/plan_test.c src/claim/alloc.c src/claim/alloc.h
	$(CC) $(CPPFLAGS) $(PG_CFLAGS) -o $@ test/alloc/plan_test.c src/claim/alloc.c
alloc-test: test/alloc/plan_test
	test/alloc/plan_test

# The lucky draw's theory that sql/lucky_group.sql checks against (a
# program of its own; prints the figures that test's header lists).
.PHONY: lucky-theory
test/alloc/lucky_theory: test/alloc/lucky_theory.c
	$(CC) -O2 -Wall -Wextra -Werror -o $@ test/alloc/lucky_theory.c -lm
lucky-theory: test/alloc/lucky_theory
	test/alloc/lucky_theory
