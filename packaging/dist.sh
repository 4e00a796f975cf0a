#!/usr/bin/env bash
# make dist: the wheel (pip/pipx) and the Debian package into OUTDIR [dist/],
# offline: setuptools from the venv without build isolation, dpkg-deb for the .deb.
# Built from a copy of the sources, since setuptools writes build/ and
# *.egg-info next to them. PYTHON: the venv interpreter [.venv/bin/python].
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$repo/dist}")"
python="${PYTHON:-$repo/.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -C "$repo" --exclude=./.venv --exclude=./.git --exclude=./dist --exclude=./build --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=./microbench/build --exclude=./docs --exclude=./tests \
  --exclude=./proxytune-report --exclude=./proxytune-results -cf - . | tar -C "$work" -xf -
mkdir -p "$out"
rm -f "$out"/proxytune-*.whl "$out"/proxytune_*.deb
"$python" -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check -w "$out" "$work"
ls "$out"/proxytune-*-py3-none-any.whl
PYTHON="$python" "$work/packaging/build-deb.sh" "$out"/proxytune-*-py3-none-any.whl "$out"
