"""core.proxytree, the one rule for "which process is the proxy", in both of its
modes: with systemd as PID 1 (the unit's cgroup; systemd is not PID 1 on this
machine, so the unit is a stand-in whose cgroup is real: made in the legacy
name=systemd hierarchy, the process really moved into it) and without (one
root-started master tree with a root-owned executable). Also: several trees,
executables a user could swap, system users from login.defs."""

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import NOBODY, needs_root
from proxytune.core import proxytree
from test_adversarial_proxy_identity import procs, real  # noqa: F401

pytestmark = needs_root
SQUID = proxytree.Identity("squid", ("squid",), "squid")


@pytest.fixture
def spawn(procs):
    return procs


@pytest.fixture
def bindir():
    """A root-owned 0755 directory; `exe(name, owner, dir_mode)` puts a copy of sleep there."""
    d = Path(tempfile.mkdtemp(prefix="pt-tree-", dir="/tmp"))
    os.chmod(d, 0o755)

    def exe(name, sub="", uid=0, mode=0o755):
        where = d / sub if sub else d
        where.mkdir(exist_ok=True)
        where.chmod(mode)
        shutil.copy("/bin/sleep", where / name)
        os.chown(where / name, uid, uid)
        return where / name
    exe.dir = d
    yield exe
    shutil.rmtree(d, ignore_errors=True)


class NoUnits(proxytree.Units):
    def get(self, name):
        return None


class OneUnit(proxytree.Units):
    def __init__(self, unit):
        super().__init__()
        self.unit = unit

    def get(self, name):
        return self.unit if name == "squid" else None


def find(units=None):
    return proxytree.find(SQUID, proxytree.Processes(), units or NoUnits())


def test_several_root_trees_the_oldest_is_chosen_and_the_others_named(spawn, bindir):
    squid = bindir("squid")
    first = spawn([str(squid), "600"], "squid")
    second = spawn([str(squid), "600"], "squid")
    c = find()
    assert c.tree.master == first.pid and [t.master for t in c.others] == [second.pid]
    assert f"using the oldest, pid {first.pid}" in c.note() and f"not pid {second.pid}" in c.note()


@pytest.mark.parametrize("how, why", [
    ("exe owned by nobody", "belongs to uid 65534"),
    ("dir writable by others", "is writable by others"),
    ("run by nobody", "does not run as root"),
])
def test_a_tree_a_user_could_start_or_swap_does_not_count(spawn, bindir, how, why):
    if how == "exe owned by nobody":
        squid = bindir("squid", uid=65534)
    elif how == "dir writable by others":
        squid = bindir("squid", sub="open", mode=0o777)         # no sticky bit: anyone may replace it
    else:
        squid = bindir("squid")
    argv = [*NOBODY, str(squid), "600"] if how == "run by nobody" else [str(squid), "600"]
    p = spawn(argv, "squid")
    c = find()
    assert c.tree is None or c.tree.master != p.pid, c
    assert any(f"pid {p.pid}" in r and why in r for r in c.refused), c.refused


def test_a_pid_reused_while_it_is_checked_does_not_count(spawn, bindir, monkeypatch):
    """A user's squid in a sticky directory exits while root's scan reads it; a root process takes its
    pid: the uids and the executable read after the snapshot were the root process's, and the user's
    older start time made it the oldest tree, displacing root's squid. Here the reuse is the stand-in:
    from the uids read on, /proc says another process (a later start time) holds the pid."""
    squid = bindir("squid", sub="sticky", mode=0o1777)
    p = spawn([str(squid), "600"], "squid")
    procs = proxytree.Processes()
    real_read = proxytree.procfs.read_stat

    def recycled(pid):
        st = real_read(pid)
        return dataclasses.replace(st, start=st.start + 1) if st is not None and pid == p.pid else st
    monkeypatch.setattr(proxytree.procfs, "read_stat", recycled)
    c = proxytree.find(SQUID, procs, NoUnits())
    assert c.tree is None or c.tree.master != p.pid, c
    assert any(f"pid {p.pid}" in r and "changed while it was checked" in r for r in c.refused), c.refused


def test_a_sticky_directory_like_tmp_is_no_reason_to_refuse(spawn, bindir):
    squid = bindir("squid", sub="sticky", mode=0o1777)
    p = spawn([str(squid), "600"], "squid")
    assert find().tree.master == p.pid


@pytest.fixture
def cgroup():
    """A real cgroup standing in for system.slice/squid.service (name=systemd hierarchy)."""
    top = Path("/sys/fs/cgroup/systemd")
    if not (top / "cgroup.procs").exists():
        pytest.skip("needs the name=systemd cgroup hierarchy")
    base = top / f"pt-test-{os.getpid()}"
    unit_dir = base / "system.slice/squid.service"
    unit_dir.mkdir(parents=True)
    try:
        yield "/" + str(unit_dir.relative_to(top)), unit_dir
    finally:
        for d in (unit_dir, unit_dir.parent, base):
            for pid in (d / "cgroup.procs").read_text().split() if (d / "cgroup.procs").exists() else []:
                (top / "cgroup.procs").write_text(pid)        # back to the root cgroup before rmdir
            d.rmdir()


def test_with_systemd_the_units_cgroup_is_the_service(spawn, bindir, cgroup):
    """In the unit's cgroup a process counts whoever owns its executable (systemd started it as the
    unit says); a root-started squid outside the cgroup does not (a second one started by hand)."""
    path, unit_dir = cgroup
    service = spawn([*NOBODY, str(bindir("squid", uid=65534)), "600"], "squid")
    (unit_dir / "cgroup.procs").write_text(str(service.pid))
    by_hand = spawn([str(bindir("squid", sub="other")), "600"], "squid")
    c = find(OneUnit(proxytree.Unit(path, service.pid)))
    assert c.tree.master == service.pid and c.tree.pids == (service.pid,), c
    assert "squid.service" in c.tree.how
    assert any(f"pid {by_hand.pid}" in r and "outside squid.service's cgroup" in r for r in c.refused), c.refused


def test_with_systemd_but_the_unit_not_running_the_root_tree_rule_applies(spawn, bindir):
    p = spawn([str(bindir("squid")), "600"], "squid")
    assert find(OneUnit(None)).tree.master == p.pid


@pytest.mark.parametrize("text, top", [("SYS_UID_MAX 499\nUID_MIN 1000\n", 499), ("UID_MIN 5000\n", 4999),
                                       ("# SYS_UID_MAX 10\n", 999), (None, 999)])
def test_system_users_come_from_login_defs(tmp_path, text, top):
    defs = tmp_path / "login.defs"
    if text is not None:
        defs.write_text(text)
    assert proxytree.sys_uid_max(defs) == top
    assert proxytree.is_system_uid(13, top) and not proxytree.is_system_uid(65534, top)
    assert not proxytree.is_system_uid(0, top)


def test_workers_of_a_user_that_is_no_system_user_are_not_taken_as_user(spawn, bindir, monkeypatch):
    """nginx built without --user runs its workers as nobody: that account is never the profile's {user}."""
    from proxytune.tune import params
    from proxytune.tune.host import Host
    shutil.copy(Path(sys.executable).resolve(), bindir.dir / "ptworkers")     # a service of its own name:
    real(spawn, bindir.dir, "ptworkers", "nobody")         # no other test's proxy is older; worker is nobody now
    notes = []
    user, source = params.detect_user(Host(), "ptworkers", notes)
    assert user == "ptworkers" and source == "default", (user, source)      # the fallback: the service's name
    assert any("nobody (uid 65534), not a system user" in n for n in notes), notes
