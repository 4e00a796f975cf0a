#!/usr/bin/env bash
# Build the Debian package from the wheel, offline, with dpkg-deb (no build
# dependencies beyond the venv; `make deb-src` builds the same package with dh):
#   python modules   /usr/lib/python3/dist-packages/proxytune
#   the rest         as packaging/debian-layout.sh lays it out (data, command, man pages,
#                    completion, /etc/proxytune/profiles/README)
#   systemd units    /lib/systemd/system/proxytune.{service,timer}, not enabled
#   control          debian/control's binary stanza; maintainer scripts debian/*
#                    with packaging/dpkg-deb/* where dh would put its snippets
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

# DEBIAN/control from debian/control: its binary stanza with the source stanza's
# Maintainer, Section and Priority; dh's substitution variables are left out
# (the dependencies they would add are written out beside them).
control() {
  local src="$here/debian/control" head
  head="$(sed -n -e '/^Package:/q' -e '/^\(Maintainer\|Section\|Priority\):/p' "$src")"
  sed -n '/^Package:/,$p' "$src" | sed -e 's/, *\${[^}]*}//g' -e "/^Package:/a Version: $1" \
    -e "/^Architecture:/a Installed-Size: $2" | awk -v head="$head" '/^Description:/ {print head} {print}'
}

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/proxytune"
doc="$root/usr/share/doc/proxytune"
units="$root/lib/systemd/system"
mkdir -p "$root/usr/lib/python3/dist-packages" "$doc" "$units" "$root/DEBIAN"

"$python" -m zipfile -e "$wheel" "$stage/wheel"
cp -r "$stage/wheel/proxytune" "$root/usr/lib/python3/dist-packages/"
PYTHON="$python" "$here/debian-layout.sh" "$root"
install -m 0644 "$here/debian/proxytune.service" "$here/debian/proxytune.timer" "$units/"
install -m 0644 "$here/debian/proxytune.proxytune-watch.service" "$units/proxytune-watch.service"
install -D -m 0644 "$here/debian/proxytune.lintian-overrides" "$root/usr/share/lintian/overrides/proxytune"
cp "$here/debian/copyright" "$doc/copyright"
gzip -9n < "$here/debian/changelog" > "$doc/changelog.Debian.gz"

find "$root" -type d -exec chmod 0755 {} +
find "$root" -type f -exec chmod 0644 {} +
chmod 0755 "$root/usr/bin/proxytune" "$root/usr/share/proxytune/probes/"*.bt   # runnable standalone: NAME.bt PID
for script in postinst prerm postrm; do     # #DEBHELPER#: what dh would generate (packaging/dpkg-deb/)
  sed -e "/^#DEBHELPER#$/{r $here/dpkg-deb/$script" -e "d}" "$here/debian/$script" > "$root/DEBIAN/$script"
  chmod 0755 "$root/DEBIAN/$script"
done
(cd "$root" && find etc -type f | sed 's|^|/|') > "$root/DEBIAN/conffiles"
size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
control "$version" "$size" > "$root/DEBIAN/control"
(cd "$root" && find usr lib -type f -print0 | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums" "$root/DEBIAN/conffiles"

mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out/proxytune_${version}_all.deb" >/dev/null
echo "$out/proxytune_${version}_all.deb"
