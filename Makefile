# The two commands in the README: `make run` and `make test`.
PY := .venv/bin/python
# Tests always run against PostgreSQL over its local socket, as the current OS user.
TEST_DATABASE_URL ?= postgres:///tether?host=/var/run/postgresql
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# The suite runs in this many processes (pytest-xdist, a test file at a time each): its tests mostly wait on
# real processes (a lease to expire, a shell to answer), so on two cores three processes keep them busier than
# two (the parallel stage 849 s against 1028 s, same machine, same day). Tests marked `exclusive` run after, alone.
TEST_JOBS ?= 3

.PHONY: run test venv frontend holder services lint bench

venv:
	@scripts/setup-venv.sh

# static/dist/ (xterm.js bundle, CSS, htmx): rebuilt only when frontend/ or the npm lock changed.
frontend:
	@scripts/build-frontend.sh

# build/tether-holder, the session holder (static C): rebuilt only when its source changed.
holder:
	@scripts/build-holder.sh

HOST ?= 127.0.0.1
PORT ?= 8000

run: venv frontend holder
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_admin
	@echo "Tether: http://$(HOST):$(PORT)/ (admin at /admin/)"
	exec $(PY) manage.py tether_serve --host $(HOST) --port $(PORT)

services:
	@scripts/ensure-services.sh
	@scripts/clean-test-leftovers.sh

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: venv services lint frontend holder
	DATABASE_URL='$(TEST_DATABASE_URL)' $(PY) manage.py makemigrations --check --dry-run
	rm -rf build/test-logs build/test-secrets
	status=0; export DATABASE_URL='$(TEST_DATABASE_URL)' TEST_REDIS_URL='$(TEST_REDIS_URL)' \
		TETHER_TEST_LOGS='$(CURDIR)/build/test-logs' TETHER_TEST_SECRETS='$(CURDIR)/build/test-secrets'; \
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile -m 'not exclusive and not after_run' || status=$$?; \
	$(PY) -m pytest -m exclusive || status=$$?; \
	$(PY) -m pytest -m after_run || status=$$?; \
	exit $$status

# Benchmarks (not part of `make test`): figures vs same-run baselines, written to docs/benchmarks.md.
bench: venv services holder
	$(PY) -m bench.run $(BENCH_ARGS)
