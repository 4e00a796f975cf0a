#!/usr/bin/env bash
# The Debian layout of an installed proxytune, shared by the two ways the .deb is
# built: packaging/build-deb.sh (dpkg-deb, `make dist`) and debian/rules (dh +
# pybuild, `make deb-src`). In: ROOT/usr/lib/python3/dist-packages/proxytune as
# the wheel installs it (python3.X/dist-packages from pybuild, which dh_python3
# moves to python3/ afterwards). Out:
#   shipped data     /usr/share/proxytune/{profiles,probes,microbench}
#   command          /usr/bin/proxytune (Debian's python3, never installs anything)
#   man pages        proxytune(8) from the CLI's help, proxytune-profile(5)
#   completion       bash, zsh and fish, from click
#   site profiles    /etc/proxytune/profiles/ with its README (a conffile)
# usage: packaging/debian-layout.sh ROOT   (PYTHON: the interpreter that runs the generators)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
root="$1"
python="${PYTHON:-$repo/.venv/bin/python}"
py="$(dirname "$(ls -d "$root"/usr/lib/python3*/dist-packages/proxytune | head -n 1)")"
share="$root/usr/share/proxytune"

mkdir -p "$share/probes" "$share/microbench" "$root/usr/bin" "$root/usr/share/man/man8" "$root/usr/share/man/man5" \
  "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
  "$root/usr/share/fish/vendor_completions.d" "$root/etc/proxytune/profiles"
find "$py" -name __pycache__ -prune -exec rm -rf {} +
mv "$py/proxytune/profiles" "$share/profiles"
mv "$py/proxytune/probes/"*.bt "$py/proxytune/probes/"*.c "$share/probes/"
# every directory of microbench/ is data: a harness's C sources (reports/measurements.py names them) or lua
for d in "$py/proxytune/microbench/"*/; do mv "${d%/}" "$share/microbench/"; done

install -m 0755 "$here/debian/proxytune.in" "$root/usr/bin/proxytune"
"$python" "$here/manpage.py" 8 | gzip -9n > "$root/usr/share/man/man8/proxytune.8.gz"
"$python" "$here/manpage.py" 5 | gzip -9n > "$root/usr/share/man/man5/proxytune-profile.5.gz"
for shell in bash zsh fish; do
  case "$shell" in
    bash) file="$root/usr/share/bash-completion/completions/proxytune" ;;
    zsh)  file="$root/usr/share/zsh/vendor-completions/_proxytune" ;;
    fish) file="$root/usr/share/fish/vendor_completions.d/proxytune.fish" ;;
  esac
  (cd "$root" && _PROXYTUNE_COMPLETE="${shell}_source" "$python" "$repo/cli.py") > "$file"
done
install -m 0644 "$here/site-profiles-README" "$root/etc/proxytune/profiles/README"
