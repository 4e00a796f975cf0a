#!/usr/bin/env bash
# make deb-src: build the Debian package from source the way an internal
# repository would rebuild it: dpkg-buildpackage -us -uc -b with dh + pybuild,
# in a staged copy of the sources whose debian/ is packaging/debian. The .deb,
# .buildinfo and .changes go to OUTDIR [dist/deb-src]. Needs the Build-Depends
# of packaging/debian/control (dpkg-checkbuilddeps names what is missing).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$repo/dist/deb-src}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
src="$work/proxytune"
mkdir -p "$src" "$out"
tar -C "$repo" --exclude=./.venv --exclude=./.git --exclude=./dist --exclude=./build --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=./microbench/build --exclude=./docs --exclude=./tests \
  --exclude=./proxytune-report --exclude=./proxytune-results -cf - . | tar -C "$src" -xf -
cp -r "$repo/packaging/debian" "$src/debian"
# Debian's own tools only: a python3 earlier on PATH (pyenv, a venv) is not the one packaged for.
(cd "$src" && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b >"$work/build.log" 2>&1) || {
  tail -n 40 "$work/build.log" >&2; echo "build-src: dpkg-buildpackage failed" >&2; exit 2; }
rm -f "$out"/proxytune_*
mv "$work"/proxytune_*.deb "$work"/proxytune_*.buildinfo "$work"/proxytune_*.changes "$out/"
ls "$out"/proxytune_*.deb
