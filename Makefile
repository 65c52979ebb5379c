# coldstart: `make drill` runs a recovery drill end to end; `make test` runs the test suite.
# Both install what is missing first (Debian packages, a .venv): run them as root.

.PHONY: bootstrap test drill bench schema clean

# Real Consul/Nomad/Vault unpacked by .ci/run (or by hand, see README) take part when present.
ifneq ($(wildcard .cache/hashistack/consul),)
export PATH := $(CURDIR)/.cache/hashistack:$(PATH)
endif

bootstrap:
	@scripts/bootstrap.sh

test: bootstrap
	.venv/bin/pytest -q -p no:cacheprovider

drill: bootstrap
	.venv/bin/coldstart drill consul-cold-start

bench: bootstrap
	.venv/bin/python bench/step_overhead.py
	.venv/bin/python bench/drill.py

schema: bootstrap
	.venv/bin/coldstart schema

clean:
	rm -rf .state .pytest_cache
