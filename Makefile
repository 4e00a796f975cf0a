# make test: installs what the tests need, then runs them.
#   - the .venv with the test dependencies (through ./proxytune's bootstrap)
#   - Debian packages the tests drive, when run as root (else: a message naming them)
SHELL := /bin/bash
# The proxies' packages come from their modules (proxies/), read when `deps` runs (after `venv`).
PROXY_PACKAGES = $(shell python3 -I packaging/proxy-packages.py)
DEBIAN_TEST_PACKAGES = ansible openssh-server tuned dbus-daemon e2fsprogs iproute2 procps systemd util-linux \
	gcc libc6-dev valgrind linux-perf bpftrace fio wrk $(PROXY_PACKAGES) chromium \
	python3-venv python3-click python3-rich python3-jsonschema python3-matplotlib python3-apt lintian \
	debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools liburing-dev tcpdump
PYTEST_ARGS ?=

.PHONY: test test-fast deps venv clean dist deb-src seed-stability

# Everything (as root: the sandboxes, the proxies, the fleet), with the 25 slowest tests at the end.
test: deps
	.venv/bin/python -m pytest --durations=25 $(PYTEST_ARGS)

# Before each commit: what needs no root and starts nothing (pure Python, one process, no Debian
# packages, any user). PROXYTUNE_TEST_FAST=1 fails a test here that starts a program anyway.
# Tiers: tests/tiers.py.
test-fast: venv
	PROXYTUNE_TEST_FAST=1 .venv/bin/python -m pytest -m "not host and not proxy and not slow" $(PYTEST_ARGS)

# Not a test: the default report three times on this host, each seed row's verdict per run
# (docs/BENCHMARKS.md "Verdicts run after run"); as root, ~3 min.
seed-stability: deps
	tools/seed-stability --runs 3

venv:
	@tests/debian-deps.sh python3-venv
	@PROXYTUNE_EXTRAS=test ./proxytune --version >/dev/null

deps: venv
	@tests/debian-deps.sh $(DEBIAN_TEST_PACKAGES)

clean:
	rm -rf .venv proxytune-report .pytest_cache dist

# make dist: the wheel (pip/pipx) and the Debian package into dist/, offline
# (setuptools from the venv, no build isolation; dpkg-deb): packaging/dist.sh.
dist: venv
	@packaging/dist.sh dist

# make deb-src: the same .deb from source, as an internal repository would rebuild it:
# dpkg-buildpackage -us -uc -b (dh + pybuild) in a staged copy whose debian/ is
# packaging/debian; into dist/deb-src/. Needs packaging/debian/control's Build-Depends.
deb-src:
	@tests/debian-deps.sh debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools \
		python3-click python3-rich python3-jsonschema
	@packaging/build-src.sh dist/deb-src
