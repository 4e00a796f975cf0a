"""Root runs no user's Python (issue 27, item 4).

`sudo -E proxytune ...` or `sudo -E apt remove proxytune` keeps the user's HOME
(and, where sudoers lets it, PYTHONPATH). /usr/bin/python3 then adds
~/.local/lib/python3.X/site-packages before Debian's dist-packages and imports
its usercustomize at start-up: a planted `click`, `usercustomize.py` or
`proxytune/tune/journal.py` ran with euid 0. The .deb is built with the project's
own packaging (`make dist`) into a temp dir; the command runs as installed (its
own shebang, its modules at /usr/lib/python3/dist-packages through an overlay in
a private mount namespace: nothing is installed on the host); the maintainer
scripts run against the unpacked package (DPKG_ROOT), as tests/test_packaging.py does.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, needs_root
from test_launcher import checkout  # noqa: F401

pytestmark = needs_root

DEBIAN_PYTHON = Path("/usr/bin/python3")
PLANT = "open({mark!r}, 'a').write('{what} ran as uid %d\\n' % __import__('os').geteuid())\n"


def debian_site_version() -> str:
    r = subprocess.run([DEBIAN_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                       capture_output=True, text=True)
    return r.stdout.strip()


@pytest.fixture(scope="module")
def deb_root(tmp_path_factory):
    if not DEBIAN_PYTHON.exists() or not shutil.which("dpkg-deb"):
        pytest.skip("needs Debian's python3 and dpkg-deb")
    if subprocess.run([DEBIAN_PYTHON, "-c", "import click, rich, jsonschema"], capture_output=True).returncode:
        pytest.skip("needs python3-click python3-rich python3-jsonschema (make deps)")
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([str(REPO / "packaging/dist.sh"), str(out)], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable}, timeout=600)
    assert r.returncode == 0, r.stderr
    deb, = out.glob("proxytune_*_all.deb")
    root = tmp_path_factory.mktemp("debroot")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    subprocess.run(["dpkg-deb", "-e", str(deb), str(root / "DEBIAN")], check=True)
    return root


@pytest.fixture
def home(tmp_path):
    """A user's HOME (nobody's), as `sudo -E` keeps it, with a user site for Debian's python3."""
    h = tmp_path / "home"
    site = h / f".local/lib/python{debian_site_version()}/site-packages"
    site.mkdir(parents=True)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(h)], check=True)
    h.chmod(0o755)
    return h, site, tmp_path / "planted-code-ran"


def plant(site: Path, mark: Path, module: str) -> None:
    """A module in the user's site: `click`, `usercustomize` or proxytune's own journal module."""
    code = PLANT.format(mark=str(mark), what=module)
    if module == "usercustomize":
        (site / "usercustomize.py").write_text(code)
    elif module == "click":
        (site / "click").mkdir()
        (site / "click/__init__.py").write_text(code)
    else:                               # proxytune.tune.journal: the package shadowed whole
        (site / "proxytune/tune").mkdir(parents=True)
        (site / "proxytune/__init__.py").touch()
        (site / "proxytune/tune/__init__.py").touch()
        (site / "proxytune/tune/journal.py").write_text(code)


def as_installed(deb_root: Path, argv: list[str], env: dict, journal: bool = False,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """argv with the package's modules at /usr/lib/python3/dist-packages, in a private mount namespace;
    journal: with an (empty) apply journal at /var/lib/proxytune on a tmpfs of that namespace."""
    lower = f"{deb_root}/usr/lib/python3/dist-packages:/usr/lib/python3/dist-packages"
    script = f"mount -t overlay pt-deb -o lowerdir={lower} /usr/lib/python3/dist-packages && "
    if journal:
        script += "mount -t tmpfs pt-state /var/lib && mkdir -p /var/lib/proxytune/journal && "
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script + 'exec "$@"', "sh",
                           *argv], capture_output=True, text=True, env=env, timeout=120, cwd=cwd)


@pytest.mark.parametrize("how", ["HOME kept: ~/.local site-packages/click", "PYTHONPATH kept: a click there"])
def test_the_installed_command_imports_no_users_module(deb_root, home, how):
    h, site, mark = home
    plant(site, mark, "click")
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(h)}
    if how.startswith("PYTHONPATH"):
        env["PYTHONPATH"] = str(site)
        env["HOME"] = "/nonexistent"
    r = as_installed(deb_root, [str(deb_root / "usr/bin/proxytune"), "--version"], env)
    assert not mark.exists(), mark.read_text()
    assert r.returncode == 0 and "0.1.0" in r.stdout, r.stdout + r.stderr


def maintainer(deb_root: Path, name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    shutil.copy(deb_root / "DEBIAN" / name, path)
    path.chmod(0o755)
    return path


def shims(tmp_path: Path) -> Path:
    """What the maintainer scripts would change on the host, made to do nothing."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for tool in ("deb-systemd-helper", "systemctl", "dpkg"):
        (d / tool).write_text("#!/bin/sh\nexit 0\n")
        (d / tool).chmod(0o755)
    return d


@pytest.mark.parametrize("script, args, module", [
    ("prerm", ["remove"], "usercustomize"),
    ("prerm", ["remove"], "proxytune.tune.journal"),
    ("postinst", ["configure", ""], "usercustomize"),
    ("prerm", ["remove"], "sitecustomize on a kept PYTHONPATH"),
])
def test_no_maintainer_script_runs_a_users_module(deb_root, home, tmp_path, script, args, module):
    """`sudo -E apt remove proxytune`: the prerm reads the apply journal with proxytune's own code and
    cleans up (py3clean), the postinst byte-compiles (py3compile); each is Python run as root."""
    h, site, mark = home
    if module.startswith("sitecustomize"):
        (site / "sitecustomize.py").write_text(PLANT.format(mark=str(mark), what=module))
    else:
        plant(site, mark, module)
    state = deb_root / "var/lib/proxytune/journal"
    state.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{shims(tmp_path)}:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(h)}
    if module.startswith("sitecustomize"):
        env["PYTHONPATH"] = str(site)
    if module == "proxytune.tune.journal":      # the real install: no DPKG_ROOT, modules from dist-packages
        r = as_installed(deb_root, [str(maintainer(deb_root, script, tmp_path)), *args], env, journal=True)
    else:
        env["DPKG_ROOT"] = str(deb_root)
        r = subprocess.run([str(maintainer(deb_root, script, tmp_path)), *args], capture_output=True, text=True,
                           env=env, timeout=120)
    try:
        assert not mark.exists(), mark.read_text() + r.stderr
    finally:
        shutil.rmtree(deb_root / "var", ignore_errors=True)


# ---------------------------------------------------------------- second attack round

def test_a_pth_file_in_the_users_site_runs_nothing_in_the_installed_command(deb_root, home):
    """site.py executes the `import` lines of every .pth file in the user site at start-up."""
    h, site, mark = home
    (site / "zz-evil.pth").write_text(f"import os; open({str(mark)!r}, 'a').write('pth ran\\n')\n")
    r = as_installed(deb_root, [str(deb_root / "usr/bin/proxytune"), "--version"],
                     {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(h)})
    assert not mark.exists() and r.returncode == 0, r.stderr


def test_the_prerm_imports_nothing_from_the_directory_it_is_run_in(deb_root, home, tmp_path):
    """`cd ~eve && sudo -E apt remove proxytune`: `python3 -` puts the working directory first on
    sys.path; a proxytune/tune/journal.py there would be root's journal reader."""
    h, site, mark = home
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    plant(cwd, mark, "proxytune.tune.journal")
    r = as_installed(deb_root, [str(maintainer(deb_root, "prerm", tmp_path)), "remove"],
                     {"PATH": f"{shims(tmp_path)}:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(h)}, journal=True, cwd=cwd)
    assert not mark.exists(), mark.read_text() + r.stderr       # (py3clean fails: the package is not installed)



# ---------------------------------------------------------------- third round: the checkout launcher after main's registry

@pytest.mark.parametrize("how", [".pth file in ~/.local site-packages, HOME kept", "sitecustomize on a kept PYTHONPATH"])
def test_the_checkout_launcher_runs_the_systems_python_isolated(checkout, home, monkeypatch, how):
    """`sudo -E ./proxytune bench proxy --proxy haproxy`: the launcher asks the registry for each proxy's
    Debian package with the system's python3 (packaging/proxy-packages.py), as root, before any venv;
    without -I that python3 ran the user's .pth files (or a sitecustomize on PYTHONPATH)."""
    h, site, mark = home
    env = {"HOME": str(h), "PROXYTUNE_NO_INSTALL": "1"}
    if how.startswith(".pth"):
        (site / "zz-evil.pth").write_text(f"import os; open({str(mark)!r}, 'a').write('pth ran\\n')\n")
    else:
        (site / "sitecustomize.py").write_text(PLANT.format(mark=str(mark), what="sitecustomize"))
        env.update(PYTHONPATH=str(site), HOME="/nonexistent")
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")      # Debian's python3, never a venv's
    r, apt, python = checkout("bench", "proxy", "--proxy", "haproxy", env=env)
    assert not mark.exists(), mark.read_text()
    assert "haproxy" in r.stderr.split("Debian packages:")[-1], r.stderr     # the registry was still read
    assert apt == [] and python and python[-1].endswith("cli.py bench proxy --proxy haproxy"), (apt, python)
