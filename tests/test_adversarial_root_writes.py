"""Every file root writes obeys the output rule (issue 27, item 5).

The node_exporter textfile (`--format prometheus -o FILE`, what the shipped
timer runs) and `man --install` wrote with atomic_write: into a directory another
account owns (Debian's /var/lib/prometheus belongs to prometheus, which can swap
node-exporter/ for its own), after reading whatever file was planted there whole
and keeping its owner; under `sudo -E`, `man --install` made a user's ~/.local
root's. The checkout launcher opened its install lock through a symlink before
cli.py ever looked at the state dir. Now each goes through write_output /
check_output (owner, not writable by others, no link followed, nothing of the
replaced file read), `man --install` refuses another user's HOME, and the lock
is opened in a checked directory before anything is installed.
"""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import needs_root, proxytune
from test_adversarial_profiles import AS_NOBODY, nobody_dir  # noqa: F401
from test_launcher import checkout  # noqa: F401

pytestmark = needs_root
TEXTFILE = ["tune", "check", "--format", "prometheus", "--only", "sysctl:fs.file-max"]


def nobody(script: str, cwd: Path) -> None:
    subprocess.run(AS_NOBODY + ["sh", "-euc", script], cwd=cwd, check=True, timeout=30)


# ---------------------------------------------------------------- the textfile (-o)

def test_the_textfile_is_not_written_into_a_directory_another_account_owns(sandbox, nobody_dir):
    r = proxytune(*TEXTFILE, "-o", str(nobody_dir / "proxytune.prom"))
    assert r.returncode == 2 and "uid 65534" in r.stderr, r.stderr
    assert not (nobody_dir / "proxytune.prom").exists()


def test_a_swapped_textfile_directory_with_a_planted_file_is_refused_unread(sandbox, nobody_dir):
    """/var/lib/prometheus is prometheus's (here nobody's): it swaps node-exporter/ for its own
    directory holding a 256 MiB proxytune.prom. Root read it whole (RSS) and kept its owner."""
    textdir = nobody_dir / "node-exporter"
    textdir.mkdir()                                 # root's, as the package made it
    nobody("mv node-exporter node-exporter.old && mkdir node-exporter && "
           "truncate -s 256M node-exporter/proxytune.prom", nobody_dir)
    r = proxytune(*TEXTFILE, "-o", str(textdir / "proxytune.prom"))
    assert r.returncode == 2 and "uid 65534" in r.stderr, r.stderr
    planted = textdir / "proxytune.prom"
    assert planted.stat().st_size == 256 << 20 and planted.stat().st_uid == 65534


def test_a_textfile_planted_in_a_sticky_directory_does_not_hand_its_owner_root_s_file(sandbox, tmp_path):
    """A sticky directory anyone writes (/tmp, as an operator's -o /tmp/x.prom): nobody plants x.prom
    mode 0666 first. Root's write kept the planted file's owner and mode, so nobody then rewrote root's
    metrics at will (a forged severity="high" series pages). Now the file is root's, mode 0644."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    nobody("umask 0 && echo planted > x.prom && chmod 0666 x.prom", sticky)
    assert (sticky / "x.prom").stat().st_uid == 65534
    r = proxytune(*TEXTFILE, "-o", str(sticky / "x.prom"))
    assert r.returncode in (0, 1), r.stderr
    st = (sticky / "x.prom").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644), (st.st_uid, oct(st.st_mode))
    assert "proxytune_" in (sticky / "x.prom").read_text()
    # a hard link nobody plants to a root file it can write (0666): root's write kept that mode
    (tmp_path / "shared").write_text("root's, writable by all\n")
    os.chmod(tmp_path / "shared", 0o666)
    (sticky / "x.prom").unlink()
    os.link(tmp_path / "shared", sticky / "x.prom")        # (as nobody it needs protected_hardlinks=0 or a 0666 file)
    r = proxytune(*TEXTFILE, "-o", str(sticky / "x.prom"))
    assert r.returncode in (0, 1), r.stderr
    st = (sticky / "x.prom").stat()
    assert (st.st_uid, st.st_mode & 0o777, st.st_nlink) == (0, 0o644, 1), (st.st_uid, oct(st.st_mode))
    assert (tmp_path / "shared").read_text() == "root's, writable by all\n"
    # an admin's choice in a directory of root's is kept: the file chowned to another account stays its
    own = tmp_path / "rootdir"
    own.mkdir(mode=0o755)
    (own / "x.prom").write_text("old\n")
    os.chown(own / "x.prom", 65534, 65534)
    os.chmod(own / "x.prom", 0o640)
    r = proxytune(*TEXTFILE, "-o", str(own / "x.prom"))
    assert r.returncode in (0, 1), r.stderr
    st = (own / "x.prom").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o640), (st.st_uid, oct(st.st_mode))


def test_a_relative_textfile_path_with_dotdot_is_written(sandbox, tmp_path):
    """`-o ../x.prom` was refused ("not a file path"), though every other -o takes it."""
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([*proxytune_argv(), *TEXTFILE, "-o", "../x.prom"], cwd=work, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode in (0, 1), r.stderr
    assert (tmp_path / "x.prom").read_text().startswith("# HELP")


def proxytune_argv():
    from conftest import CLI, REPO
    return [str(REPO / ".venv/bin/python"), str(CLI)]


# ---------------------------------------------------------------- man --install

def man_install(env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*proxytune_argv(), "man", "--install"], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("how", ["HOME kept, no ~/.local yet", "XDG_DATA_HOME with the user's man8/"])
def test_man_install_as_root_never_writes_into_another_users_home(nobody_dir, how):
    """`sudo -E proxytune man --install`: root made the user's ~/.local/share/man (and below) its own,
    or dropped root's files into the user's man8/."""
    home = nobody_dir
    env = {"HOME": str(home), "XDG_DATA_HOME": ""}
    if how.startswith("XDG"):
        nobody("mkdir -p data/man/man8 data/man/man5", home)
        env["XDG_DATA_HOME"] = str(home / "data")
    before = sorted((p, p.stat().st_uid) for p in home.rglob("*"))
    r = man_install(env, home)
    assert r.returncode == 2 and "uid 65534" in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2
    assert sorted((p, p.stat().st_uid) for p in home.rglob("*")) == before


def test_man_install_says_what_it_wrote_without_escapes_and_never_half_of_it(tmp_path):
    """A data dir whose name carries a terminal escape was echoed raw; with man5/ a file, man8's page was
    written and then 'nothing was changed' was said."""
    data = tmp_path / "d\x1b]0;pwned\x07"
    (data / "man").mkdir(parents=True)
    (data / "man/man5").write_text("not a directory\n")
    r = man_install({"XDG_DATA_HOME": str(data)}, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr
    assert not (data / "man/man8/proxytune.8").exists() or "nothing was changed" not in r.stderr
    (data / "man/man5").unlink()
    r = man_install({"XDG_DATA_HOME": str(data)}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (data / "man/man8/proxytune.8").is_file() and (data / "man/man5/proxytune-profile.5").is_file()
    assert "\x1b" not in r.stdout and "\\x1b" in r.stdout, r.stdout


# ---------------------------------------------------------------- the launcher's install lock

@pytest.mark.parametrize("how", ["install.lock planted as a symlink", "the state dir is a symlink"])
def test_the_launchers_install_lock_follows_no_link_and_installs_nothing_there(checkout, nobody_dir, tmp_path, how):
    """`sudo -E ./proxytune doctor ...` with PROXYTUNE_STATE_DIR in a directory nobody owns: the lock
    was opened (created) through nobody's symlink, as root, before cli.py refused the state dir."""
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    if how.startswith("install.lock"):
        nobody(f"mkdir -m 700 state && ln -s {victim}/created-by-root state/install.lock", nobody_dir)
        state = nobody_dir / "state"
    else:
        nobody(f"ln -s {victim} state", nobody_dir)
        state = nobody_dir / "state"
    r, apt, python = checkout("doctor", "--comm", "squid", env={"PROXYTUNE_STATE_DIR": str(state)})
    assert list(victim.iterdir()) == [], list(victim.iterdir())
    assert apt == [], apt
    assert "install" in r.stderr and str(state) in r.stderr, r.stderr


# ---------------------------------------------------------------- second attack round

def test_man_install_with_a_relative_data_home_in_a_users_directory_is_refused(nobody_dir, tmp_path):
    """XDG_DATA_HOME=share (relative: the XDG spec says ignore it) run from the user's directory. Root's
    HOME is a temp dir of root's here (the real /root is never written by a test)."""
    root_home = tmp_path / "root-home"
    root_home.mkdir(mode=0o700)
    r = man_install({"XDG_DATA_HOME": "share", "HOME": str(root_home)}, nobody_dir)
    assert not (nobody_dir / "share").exists(), r.stdout
    assert r.returncode in (0, 2), r.stdout + r.stderr
    if r.returncode == 0:                       # ignored, as the spec says: root's own ~/.local/share
        assert f"{root_home}/.local/share/man" in r.stdout, r.stdout
        assert (root_home / ".local/share/man/man8/proxytune.8").is_file()


def test_the_launcher_refuses_a_relative_state_dir_before_installing(checkout, nobody_dir):
    r, apt, python = checkout("doctor", "--comm", "squid", env={"PROXYTUNE_STATE_DIR": "state"})
    assert apt == [] and "not an absolute path" in r.stderr, r.stderr
