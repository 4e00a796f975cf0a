# make test: installs what the tests need, then runs them.
#   - the .venv with the test dependencies (through ./proxytune's bootstrap)
#   - Debian packages the tests drive, when run as root (else: a message naming them)
SHELL := /bin/bash
DEBIAN_TEST_PACKAGES := ansible e2fsprogs iproute2 procps util-linux
PYTEST_ARGS ?=

.PHONY: test deps venv clean

test: deps
	.venv/bin/python -m pytest $(PYTEST_ARGS)

venv:
	@PROXYTUNE_EXTRAS=test ./proxytune --version >/dev/null

deps: venv
	@missing=$$(for p in $(DEBIAN_TEST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done | xargs); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages: $$missing"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "make test needs the Debian packages: $$missing (as root: apt-get install $$missing)"; exit 2; \
	  fi; \
	fi

clean:
	rm -rf .venv proxytune-report .pytest_cache
