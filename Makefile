# coldstart: `make drill` runs a recovery drill end to end; `make test` runs the test suite.
# Both install what is missing first (Debian packages, a .venv): run them as root.

.PHONY: bootstrap hashistack temporal-server check test test-py313 drill cluster bench schema clean lock infra-up

# Real Consul/Nomad/Vault unpacked by .ci/run or `make hashistack` (or by hand, see README) take part when
# present; on PATH for every recipe, whether unpacked before make started or by a prerequisite.
export PATH := $(CURDIR)/.cache/hashistack:$(PATH)

bootstrap:
	@scripts/bootstrap.sh

# Temporal's real server and SQL tool, built from source with Go once per machine into
# /var/cache/coldstart/temporal-server (COLDSTART_TEMPORAL_CACHE); minutes the first time, then a check.
# Without Go, tests/cluster skips and says so.
temporal-server:
	@if command -v go >/dev/null || [ -x /usr/local/go/bin/go ]; then scripts/temporal-cluster-install.sh >/dev/null; \
	else echo "no Go toolchain: the PostgreSQL cluster tests (tests/cluster) will be skipped"; fi

# Static checks, seconds: ruff lints the whole tree, basedpyright type-checks the controller (both from
# requirements.lock, configured in pyproject.toml; basedpyright runs on its own Node, nothing is downloaded).
check: bootstrap
	.venv/bin/ruff check --quiet .
	.venv/bin/basedpyright

# Two workers: most tests wait on servers, not on a core; tests/conftest.py keeps each lab on one worker.
# The static checks first: a finding fails the run before the suite starts.
test: bootstrap hashistack temporal-server check
	.venv/bin/pytest -q -p no:cacheprovider -n 2 --durations=20

# The suite without its labs on CPython 3.13, in .venv-py313 from requirements-py313.lock (.ci/run, after
# `make test`): tests/lab, tests/hosts (network namespaces, the real agents) and tests/cluster (the real Temporal
# server on PostgreSQL) are left out, and with them every test marked `lab`.
PY313_LEFT_OUT := --ignore=tests/lab --ignore=tests/hosts --ignore=tests/cluster -m "not lab"
test-py313: hashistack
	@scripts/bootstrap.sh 3.13
	.venv-py313/bin/pytest -q -p no:cacheprovider -n 2 --durations=10 $(PY313_LEFT_OUT)

# The binaries from ../shared/hashistack when it is there (the stand-ins are only the fallback for a machine
# without them, and the cold-start runbook turns streaming off in the real agents' own configuration).
hashistack:
	@if [ -x ../shared/hashistack/unpack ]; then ../shared/hashistack/unpack .cache/hashistack >/dev/null; fi

drill: bootstrap hashistack
	.venv/bin/coldstart drill consul-cold-start

# The running lab's telemetry host (`coldstart lab up` first) deployed by a real `pulumi up` of infra/ over SSH;
# the engine is `pulumi` on PATH, else ../shared/pulumi (scripts/pulumi-install.sh). Nothing is downloaded.
infra-up: bootstrap
	.venv/bin/coldstart lab telemetry --pulumi

# The production topology: the real Temporal server on a private PostgreSQL, until Ctrl-C.
cluster: bootstrap temporal-server
	.venv/bin/coldstart server --postgres --state-dir .state/cluster

bench: bootstrap temporal-server
	.venv/bin/python bench/step_overhead.py
	.venv/bin/python bench/cluster.py
	.venv/bin/python bench/drill.py

schema: bootstrap
	.venv/bin/coldstart schema

# requirements.lock: every runtime, test and check dependency pinned with its hashes, for Linux x86_64 /
# CPython 3.11 (what bootstrap installs). Existing pins are kept; to move some on:
# `make lock LOCK_ARGS='--upgrade-package NAME'` (or `LOCK_ARGS=--upgrade` for all). The resolver
# (uv, pinned) lives in .cache/lock-tool, never in .venv (scripts/uv.sh; bootstrap installs with it too).
# requirements-py313.lock is the same for CPython 3.13 (.venv-py313, `make test-py313`), resolved from
# requirements.lock's pins as preferences: the same versions, unless 3.13 needs another (wheels only).
lock:
	uv=$$(scripts/uv.sh) && UV_CUSTOM_COMPILE_COMMAND='make lock' $$uv pip compile -q pyproject.toml --all-extras \
	  --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  -o requirements.lock $(LOCK_ARGS) && \
	cp requirements.lock .cache/requirements-py313.lock && \
	UV_CUSTOM_COMPILE_COMMAND='make lock' $$uv pip compile -q pyproject.toml --all-extras \
	  --generate-hashes --python-version 3.13 --python-platform x86_64-manylinux_2_28 --no-build \
	  -o .cache/requirements-py313.lock && \
	mv .cache/requirements-py313.lock requirements-py313.lock

clean:
	rm -rf .state .pytest_cache
