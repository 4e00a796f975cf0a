#!/usr/bin/env bash
# Install the Debian packages the tests drive, when root; name them otherwise.
# Package scripts must not start the services they ship (nginx, squid would
# bind ports 80 and 3128, haproxy, varnish 6081, trafficserver 8080): a policy-rc.d that says "no" is put in place for
# the install, if none is there already, and removed afterwards.
set -euo pipefail
missing=$(for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done | xargs)
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "make test needs the Debian packages: $missing (as root: apt-get install $missing)"; exit 2
fi
echo "installing Debian packages: $missing"
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -q >/dev/null
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
