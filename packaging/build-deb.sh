#!/usr/bin/env bash
# Build the Debian package from the wheel, offline, with dpkg-deb:
#   python modules   /usr/lib/python3/dist-packages/proxytune
#   shipped data     /usr/share/proxytune/{profiles,probes,microbench}
#   command          /usr/bin/proxytune (Debian's python3, never installs anything)
#   man page         /usr/share/man/man8/proxytune.8.gz, generated from the CLI's help
#   completion       /usr/share/bash-completion/completions/proxytune
# usage: packaging/build-deb.sh WHEEL OUTDIR   (PYTHON: the interpreter that runs the generators)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
wheel="$1" out="$2"
python="${PYTHON:-$repo/.venv/bin/python}"

version="$(sed -n '1s/^proxytune (\([^)]*\)).*/\1/p' "$here/debian/changelog")"
upstream="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/cli.py")"
if [ -z "$version" ] || [ "${version%-*}" != "$upstream" ]; then
  echo "build-deb: changelog version '$version' does not match cli.__version__ '$upstream'" >&2; exit 2
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/proxytune"
py="$root/usr/lib/python3/dist-packages"
share="$root/usr/share/proxytune"
doc="$root/usr/share/doc/proxytune"
mkdir -p "$py" "$share/probes" "$share/microbench" "$doc" "$root/usr/bin" "$root/usr/share/man/man8" \
  "$root/usr/share/bash-completion/completions" "$root/DEBIAN"

"$python" -m zipfile -e "$wheel" "$stage/wheel"
cp -r "$stage/wheel/proxytune" "$py/"
find "$py" -name __pycache__ -prune -exec rm -rf {} +
mv "$py/proxytune/profiles" "$share/profiles"
mv "$py/proxytune/probes/"*.bt "$py/proxytune/probes/"*.c "$share/probes/"
for d in evbench fdscan objbench lua; do mv "$py/proxytune/microbench/$d" "$share/microbench/"; done

install -m 0755 "$here/debian/proxytune.in" "$root/usr/bin/proxytune"
"$python" "$here/manpage.py" | gzip -9n > "$root/usr/share/man/man8/proxytune.8.gz"
(cd "$stage" && _PROXYTUNE_COMPLETE=bash_source "$python" "$repo/cli.py") \
  > "$root/usr/share/bash-completion/completions/proxytune"
cp "$here/debian/copyright" "$doc/copyright"
gzip -9n < "$here/debian/changelog" > "$doc/changelog.Debian.gz"

find "$root" -type d -exec chmod 0755 {} +
find "$root" -type f -exec chmod 0644 {} +
chmod 0755 "$root/usr/bin/proxytune" "$share/probes/"*.bt   # runnable standalone: NAME.bt PID
install -m 0755 "$here/debian/postinst" "$here/debian/prerm" "$root/DEBIAN/"
size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" "$here/debian/control.in" > "$root/DEBIAN/control"
(cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"

mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out/proxytune_${version}_all.deb" >/dev/null
echo "$out/proxytune_${version}_all.deb"
