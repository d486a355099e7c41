# sessionize: `make demo` and `make test` work on a fresh machine (Python 3.11+, apt for Java).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR := data
DAGSTER_HOME_DIR := $(CURDIR)/.dagster_home
DEMO_DAYS ?= 14
# The demo's history ends yesterday (UTC), as a live system's would: its partitions are filled
# up to now, and today's batch is the next to land (make demo-day). make demo records the start
# date in DAGSTER_HOME, so make ui and make demo-day on a later day keep the same partitions.
DEMO_START_FILE := $(DAGSTER_HOME_DIR)/demo_start
DEMO_START ?= $(shell cat $(DEMO_START_FILE) 2>/dev/null || date -u -d "-$(DEMO_DAYS) days" +%F)
DEMO_USERS ?= 300
# The demo's two weeks are shorter than the lateness horizon and window (28 + 28 days) the
# grace period is learned from by default, which would leave every day provisional: the demo
# learns it from 3 to 9 days back (docs/daily.md).
DEMO_LATENESS := SESSIONIZE_LATENESS_HORIZON_DAYS=3 SESSIONIZE_LATENESS_WINDOW_DAYS=7
DEMO_SEED ?= 7

# The Delta Lake jars for Spark: the release built for the installed pyspark (Delta 4.0.x for
# Spark 4.0.x, docs.delta.io/releases), fetched from Maven Central with mvn into an ignored
# folder. Spark loads them from there (spark.jars): no network when a session starts.
DELTA_VERSION := 4.0.1
DELTA_JARS_DIR := jars/delta
DELTA_JARS_STAMP := $(DELTA_JARS_DIR)/.fetched-$(DELTA_VERSION)
# Hadoop's S3 connector and the AWS SDK modules it calls, for a lake on S3 (docs/storage.md,
# Object storage): the versions are in the pom, hadoop-aws's that of pyspark's own Hadoop jars.
S3A_POM := maven/s3a-connector.pom.xml
S3A_JARS_DIR := jars/s3a
S3A_JARS_STAMP := $(S3A_JARS_DIR)/.fetched
# The class archive every driver JVM maps its classes from (Java's CDS): written at the exit of
# a small replay, it halves the time a new JVM spends loading classes (docs/spark.md). Written
# again after an install (another pyspark is another class path).
JVM_ARCHIVE := jars/spark-driver.jsa

.PHONY: help java postgres jars jvm-archive demo demo-day test lint format ui serve serve-stop screenshot bench bench-small bench-daemon soak clean

help:
	@echo "make demo   set up, generate a landing zone, run the pipeline over it"
	@echo "make test   set up and run the test suite (ruff, mypy, pytest)"
	@echo "make ui     open the Dagster UI (dagster dev, its runs on a warm Spark) on the demo's history"
	@echo "make demo-day  land the demo zone's next day (the UI's sensors process it)"
	@echo "make serve  the deployment: webserver, daemon, code server on Postgres, supervised (docs/deployment.md)"
	@echo "make screenshot  PNGs of the UI from headless Chromium (after make demo)"
	@echo "make bench  the small-batch and scale benchmarks (BENCH_ARGS=--quick: a few minutes; --mid: 1/25 of the full size)"
	@echo "make bench-small  a small batch against a bare PySpark full recompute, by phase"
	@echo "make bench-daemon  the UI's runs (sessionize dev) against the same batches in one process"
	@echo "make soak   30 batches under sessionize dev with its processes killed (SOAK_ARGS=--seed N; --serve: the deployment)"
	@echo "make jars   fetch the Delta Lake and S3 connector jars from Maven Central (make test does)"
	@echo "make jvm-archive  the class archive new Spark drivers start from (make test and make ui do)"

# PySpark 4 needs Java 17 or newer; install it with apt-get when it is missing.
java:
	@if java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; then \
		true; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "Java 17 not found: installing openjdk-17-jre-headless with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	else \
		echo "error: Java 17+ is required by Spark and was not found." >&2; \
		echo "Install it (e.g. 'sudo apt-get install openjdk-17-jre-headless') and retry." >&2; \
		exit 1; \
	fi

# `make serve` keeps Dagster's storage in a Postgres cluster of its own: Debian's server,
# installed with apt-get when it is missing (its programs in /usr/lib/postgresql/N/bin).
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then \
		true; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "Postgres not found: installing postgresql with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	else \
		echo "error: Postgres's server is required by make serve and was not found." >&2; \
		echo "Install it (e.g. 'sudo apt-get install postgresql'), or set DAGSTER_PG_URL." >&2; \
		exit 1; \
	fi

jars: $(DELTA_JARS_STAMP) $(S3A_JARS_STAMP)

# delta-spark and delta-storage only: their other runtime dependencies (Scala, ANTLR) are
# pyspark's own jars, and a second copy of a different version must not join the classpath.
$(DELTA_JARS_STAMP):
	@command -v mvn >/dev/null || { \
		echo "error: Maven (mvn) fetches the Delta Lake jars and was not found." >&2; \
		echo "Install it (e.g. 'sudo apt-get install maven'), or see docs/storage.md for" >&2; \
		echo "spark.jars.packages, which has Spark fetch them when a session starts." >&2; \
		exit 1; }
	rm -rf $(DELTA_JARS_DIR)
	for artifact in delta-spark_2.13 delta-storage; do \
		mvn --batch-mode --quiet dependency:copy -Dartifact=io.delta:$$artifact:$(DELTA_VERSION) \
			-DoutputDirectory=$(DELTA_JARS_DIR) || exit 1; \
	done
	touch $@

$(S3A_JARS_STAMP): $(S3A_POM)
	@command -v mvn >/dev/null || { echo "error: Maven (mvn) fetches the S3 connector's jars and was not found." >&2; exit 1; }
	rm -rf $(S3A_JARS_DIR)
	mvn --batch-mode --quiet -f $(S3A_POM) dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(S3A_JARS_DIR) \
		-DexcludeGroupIds=io.netty,org.slf4j,commons-logging,commons-codec,org.apache.httpcomponents
	touch $@

jvm-archive: $(JVM_ARCHIVE)

$(JVM_ARCHIVE): $(STAMP)
	$(BIN)/python scripts/jvm_class_archive.py $@

$(VENV):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Two workers, a whole module at a time (modules share fixtures and some tests build on the
# previous one), the slow modules first (sessionize_tests/conftest.py).
PYTEST_WORKERS ?= 2
test: java postgres jars $(JVM_ARCHIVE) $(STAMP) lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

$(DAGSTER_HOME_DIR)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME_DIR)
	cp dagster.yaml $@

demo: java $(STAMP) $(DAGSTER_HOME_DIR)/dagster.yaml
	rm -rf $(DEMO_DIR)/landing $(DEMO_DIR)/lake
	@# A new lake needs a new run history: the sensors read the instance's materializations.
	find $(DAGSTER_HOME_DIR) -mindepth 1 ! -name dagster.yaml -exec rm -rf {} +
	$(eval DEMO_START := $(shell date -u -d "-$(DEMO_DAYS) days" +%F))
	echo $(DEMO_START) > $(DEMO_START_FILE)
	SESSIONIZE_START_DATE=$(DEMO_START) $(BIN)/sessionize generate --out $(DEMO_DIR)/landing \
		--start $(DEMO_START) --days $(DEMO_DAYS) --users $(DEMO_USERS) --seed $(DEMO_SEED)
	@# The history is a backlog: its batches go together, as the landing sensor takes folders it
	@# finds at one tick (one range run per step). make demo-day then lands one daily batch.
	DAGSTER_HOME=$(DAGSTER_HOME_DIR) SESSIONIZE_START_DATE=$(DEMO_START) $(DEMO_LATENESS) \
		$(BIN)/sessionize replay --at-once
	@echo
	@$(DEMO_LATENESS) SESSIONIZE_START_DATE=$(DEMO_START) $(BIN)/sessionize daily --days 7
	@echo
	@echo "Open the Dagster UI on this history:  make ui   (then http://127.0.0.1:3000)"
	@echo "Then land the next day's batch:        make demo-day   (the sensors take it from there)"

# The demo zone's next day, as the generator would have written it (same seed): with make ui
# running, the landing sensor ingests it and the rest follows with no click.
demo-day: $(STAMP)
	SESSIONIZE_START_DATE=$(DEMO_START) $(BIN)/sessionize generate --out $(DEMO_DIR)/landing \
		--start $(DEMO_START) --append-day --users $(DEMO_USERS) --seed $(DEMO_SEED)

# `sessionize dev`: dagster dev, and a Spark Connect server its runs share (started before it,
# stopped with it; its output in DAGSTER_HOME/spark-server.log). docs/spark-server.md.
ui: java $(STAMP) $(JVM_ARCHIVE) $(DAGSTER_HOME_DIR)/dagster.yaml
	DAGSTER_HOME=$(DAGSTER_HOME_DIR) SESSIONIZE_START_DATE=$(DEMO_START) $(DEMO_LATENESS) \
		$(BIN)/sessionize dev -h 127.0.0.1 -p 3000

# The deployment (docs/deployment.md): Postgres, the Spark Connect server, the code server,
# dagster-webserver and dagster-daemon under supervisord, in the foreground (Ctrl-C stops
# them all; so does `make serve-stop` from another terminal). Its files are in .deploy/.
serve: java postgres $(STAMP) $(JVM_ARCHIVE)
	SESSIONIZE_DEPLOY_DIR=$(CURDIR)/.deploy $(BIN)/sessionize serve

serve-stop: $(STAMP)
	SESSIONIZE_DEPLOY_DIR=$(CURDIR)/.deploy $(BIN)/sessionize serve --stop

# Headless Chromium against a real `dagster dev` on the demo's history; the PNG is not committed.
SCREENSHOT ?= /tmp/sessionize.png
# The lineage graph, sessions' partitions and one of them, the snapshot's plots, the sensors,
# the landing sensor's ticks and the runs it launched; daily_sessions' partition, plots and
# freshness check, and the grace period in arrivals' metadata.
SCREENSHOT_PAGES ?= graph partitions partition plots sensors landing_sensor landing_runs \
	daily_partition daily_plots freshness arrivals
screenshot: $(STAMP) $(DAGSTER_HOME_DIR)/dagster.yaml
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
		else \
			echo "error: Chromium is required; install it (e.g. 'sudo apt-get install chromium')" >&2; \
			exit 1; \
		fi; \
	fi
	SESSIONIZE_START_DATE=$(DEMO_START) $(DEMO_LATENESS) PYTHONPATH=$(CURDIR) \
		$(BIN)/python scripts/screenshot_ui.py \
		--dagster-home $(DAGSTER_HOME_DIR) --out $(SCREENSHOT) \
		$(foreach page,$(SCREENSHOT_PAGES),--page $(page))

# The small-batch benchmark first (a few minutes: a batch of about 1,000 lines against a bare
# PySpark recompute of the whole 8-day zone, and the batch by phase), then the scale benchmark:
# about 20 M events by default (an hour or more on 2 cores). Both print tables.
BENCH_ARGS ?=
BENCH_SMALL_ARGS ?=
BENCH_DAEMON_ARGS ?=
bench: bench-small bench-daemon
	$(BIN)/python scripts/bench_scale.py $(BENCH_ARGS)

# BENCH_SMALL_ARGS="--storage sqlite,postgres": the same zone with Dagster on each, in one run
# (Postgres: a cluster of the bench's own; hence `postgres`, and the tests' free_port).
bench-small: java jars postgres $(STAMP)
	PYTHONPATH=$(CURDIR) $(BIN)/python scripts/bench_small_batch.py $(BENCH_SMALL_ARGS)

# Scripts that drive `dagster dev` import its driver from the tests (sessionize_tests/dev_server.py,
# not part of the installed package): hence PYTHONPATH.
# The UI's path (about 10 minutes): batches of about 2,000 lines dropped one by one under
# `sessionize dev`, each run's wall next to the same batches in one process (`sessionize
# replay`); --classic-daemon adds plain `dagster dev`, a JVM per run (docs/spark-server.md).
bench-daemon: java $(STAMP) $(JVM_ARCHIVE)
	PYTHONPATH=$(CURDIR) $(BIN)/python scripts/bench_daemon.py $(BENCH_DAEMON_ARGS)

# A month of operation under `sessionize dev`, its run workers, daemon, Spark server and whole
# tree killed on the way; the tables must end equal to the full recompute (docs/testing.md).
# Long by design (about an hour), not part of make test. SOAK_ARGS=--seed N repeats a soak.
SOAK_ARGS ?=
soak: java jars $(STAMP) $(JVM_ARCHIVE)
	PYTHONPATH=$(CURDIR) $(BIN)/python -m sessionize_tests.soak.driver $(SOAK_ARGS)

clean:
	rm -rf $(DEMO_DIR) $(DAGSTER_HOME_DIR) spark-warehouse .pytest_cache .ruff_cache
