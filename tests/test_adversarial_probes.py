"""Adversarial cases for the raw device (`bench storage --device`) and for
doctor / probe (issue 10, items 9 and 10): each asserts the exit code, the one
line said, and that the sandbox is as it was (loop devices, mounts, the run's
temp dir, device contents by hash) or changed exactly as documented.

Every run gets a private TMPDIR, so "nothing left in /tmp" is checked on what
this run could create even while other proxytune runs share the machine;
loop and mount lists from tests/snapshot.py are compared on the names this
test made (its images and its TMPDIR).
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, needs_root, wait_for
from snapshot import SandboxState

MIB = 1 << 20
HAS_TRACERS = IS_ROOT and shutil.which("bpftrace") and shutil.which("perf")
needs_tracers = pytest.mark.skipif(not HAS_TRACERS, reason="needs root, bpftrace and perf")


# ------------------------------------------------------------------ helpers

@pytest.fixture
def private_tmp():
    """A TMPDIR of this test's own (root-owned, 0700), checked empty afterwards by the tests."""
    d = Path(tempfile.mkdtemp(prefix="ptadv-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pt(*args, tmp: Path, timeout=240, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, **kw)


def popen(*args, tmp: Path) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def one_line_error(p: subprocess.CompletedProcess, words: str, code: int = 2) -> None:
    """Exit `code`, stderr = one error line (plus at most a hint), naming `words`, no traceback."""
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    lines = [l for l in p.stderr.splitlines() if not l.startswith("proxytune: removed ")]
    assert lines and lines[0].startswith("proxytune: error: "), p.stderr
    assert words in lines[0], lines[0]
    assert len(lines) <= 2 and all(l.startswith("hint: ") for l in lines[1:]), p.stderr
    assert "Traceback" not in p.stderr


def ours(diff: list[str], *tags: str) -> list[str]:
    """The lines of a SandboxState diff about what this test made (other helpers share the machine)."""
    return [d for d in diff if any(t in d for t in tags)]


def tmp_left(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir())


def sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


class Images:
    """Images on loop devices, made by the test and detached afterwards."""

    def __init__(self, root: Path):
        self.root, self.loops = root, []

    def make(self, name: str, fill=None, size_mb: int = 80) -> str:
        img = self.root / f"{name}.img"
        with open(img, "wb") as fh:
            fh.truncate(size_mb * MIB)
            if fill:
                fill(fh, size_mb * MIB)
        dev = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True,
                             check=True).stdout.strip()
        self.loops.append(dev)
        return dev

    def close(self):
        for dev in self.loops:
            subprocess.run(["umount", dev], capture_output=True)
            subprocess.run(["losetup", "-d", dev], capture_output=True)


@pytest.fixture
def images():
    root = Path(tempfile.mkdtemp(prefix="ptadv-img-"))
    imgs = Images(root)
    try:
        yield imgs
    finally:
        imgs.close()
        shutil.rmtree(root, ignore_errors=True)


def holds(pid: int, rdev: int) -> bool:
    """Whether process pid has the block device rdev open."""
    try:
        return any(os.stat(fd).st_rdev == rdev for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def random_bytes(fh, size):
    fh.seek(0)
    for _ in range(size // MIB):
        fh.write(os.urandom(MIB))


def text_in_the_middle(fh, size):
    fh.seek(size // 2 + 12345)
    fh.write(b"INSERT INTO users VALUES ('alice', 'hunter2');\n")


def refused_and_untouched(images, dev, tmp, args, words):
    """Run bench storage on dev; it must be refused with `words`, the device and sandbox as they were."""
    before, digest = SandboxState.take(), sha(dev)
    p = pt("bench", "storage", "--quick", "--engine", "sync", *args, tmp=tmp)
    one_line_error(p, words)
    assert sha(dev) == digest
    assert ours(before.diff(SandboxState.take()), str(tmp), str(images.root)) == []
    assert tmp_left(tmp) == []
    return p


# ------------------------------------------------------------------ raw device

@needs_root
def test_random_bytes_without_signature_are_data(images, private_tmp):
    dev = images.make("random", random_bytes)
    refused_and_untouched(images, dev, private_tmp, ["--device", dev],
                          f"refusing to write to {dev}: it holds data: byte 0")


@needs_root
def test_text_in_the_middle_is_found_and_its_offset_named(images, private_tmp):
    dev = images.make("text", text_in_the_middle)
    where = 40 * MIB + 12345
    refused_and_untouched(images, dev, private_tmp, ["--device", dev], f"it holds data: byte {where} (at 40.0 MiB")


@needs_root
def test_text_near_the_end_of_a_small_device_is_found(images, private_tmp):
    """A device smaller than the sample is read whole: nothing escapes."""
    def tail(fh, size):
        fh.seek(size - 700)
        fh.write(b"x")
    dev = images.make("tail", tail, size_mb=40)
    refused_and_untouched(images, dev, private_tmp, ["--device", dev], f"byte {40 * MIB - 700} ")


@needs_root
def test_a_filesystem_signature_is_refused(images, private_tmp):
    dev = images.make("ext4")
    subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True)
    refused_and_untouched(images, dev, private_tmp, ["--device", dev], "carries a signature (ext4)")


@needs_root
def test_a_device_held_o_excl_by_another_process_is_refused_even_forced(images, private_tmp):
    dev = images.make("held")
    holder = subprocess.Popen([sys.executable, "-c", f"import os, sys, time; os.open({dev!r}, os.O_RDONLY | os.O_EXCL);"
                               " print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused_and_untouched(images, dev, private_tmp, ["--device", dev, "--force-destroy-data"],
                              f"it is held open exclusively by another process (open in pid {holder.pid} (python")
    finally:
        holder.kill()
        holder.wait()


@needs_root
def test_a_mounted_device_is_refused_even_forced(images, private_tmp):
    dev = images.make("mounted")
    # no lazy inode-table init and a read-only mount: the kernel itself must not write to it meanwhile
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev], check=True)
    mnt = images.root / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "ro", dev, str(mnt)], check=True)
    try:
        refused_and_untouched(images, dev, private_tmp, ["--device", dev, "--force-destroy-data"],
                              f"is mounted on {mnt}")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@needs_root
def test_a_symlink_is_resolved_and_said(images, private_tmp):
    dev = images.make("linked", text_in_the_middle)
    link = images.root / "by-id-disk"
    link.symlink_to(dev)
    refused_and_untouched(images, dev, private_tmp, ["--device", str(link)],
                          f"refusing to write to {link} (a symlink to {dev}): it holds data")


@needs_root
@pytest.mark.parametrize("kind, words", [
    ("empty", "--device is empty"),
    ("blank", "--device is empty"),
    ("file", "is not a block device: it is a regular file"),
    ("dir", "is not a block device: it is a directory"),
    ("missing", "does not exist"),
    ("newline", "contains control characters"),
    ("chardev", "is not a block device: it is a character device"),
    ("unbound", "has size 0: no medium, or a loop device with nothing bound"),
])
def test_a_path_that_is_no_block_device_is_one_line(kind, words, private_tmp, images):
    f = images.root / "plain.img"
    f.write_bytes(b"\0" * 4096)
    dev = {"empty": "", "blank": "  ", "file": str(f), "dir": str(images.root), "missing": "/dev/no-such-disk",
           "newline": "/dev/loop0\nproxytune: error: fake", "chardev": "/dev/null", "unbound": "unbound"}[kind]
    if kind == "unbound":           # a loop device with nothing behind it
        dev = subprocess.run(["losetup", "--find"], capture_output=True, text=True, check=True).stdout.strip()
    before = SandboxState.take(images.root)
    p = pt("bench", "storage", "--quick", "--device", dev, tmp=private_tmp)
    one_line_error(p, words)
    assert ours(before.diff(SandboxState.take(images.root)), str(images.root), str(private_tmp)) == []
    assert tmp_left(private_tmp) == []


@needs_root
def test_a_zeroed_device_is_accepted_held_o_excl_and_written(images, private_tmp):
    """The documented change: the bench writes the device; while it runs nobody else can claim it."""
    dev = images.make("zero")
    blank = sha(dev)
    p = popen("bench", "storage", "--quick", "--engine", "sync", "--device", dev, "--json",
              "-o", str(images.root / "result.json"), tmp=private_tmp)
    rdev = os.stat(dev).st_rdev
    assert wait_for(lambda: p.poll() is not None or holds(p.pid, rdev)), "the bench never opened the device"
    try:                                              # only tried once the bench holds it: never steals it
        os.close(os.open(dev, os.O_RDONLY | os.O_EXCL))
        seen_busy = p.poll() is not None and "bench ended first"
    except OSError as e:
        seen_busy = e.errno == 16                     # EBUSY
    out, err = p.communicate()
    assert p.returncode == 0, err[-2000:]
    assert seen_busy is True, "the device was not held O_EXCL while the bench ran"
    doc = json.loads(out)["data"]
    assert doc["rawdev_target"] == dev and doc["rawdev_check"]["sampled_bytes"] >= 67 * MIB
    assert any(c["store"] == "rawdev" and c["available"] for c in doc["combos"])
    assert sha(dev) != blank                          # it did write there, as documented
    fd = os.open(dev, os.O_RDONLY | os.O_EXCL)        # and let go of it
    os.close(fd)
    assert tmp_left(private_tmp) == []


@needs_root
def test_force_destroy_data_overrides_data_but_says_so(images):
    from proxytune.microbench import rawdev
    dev = images.make("forced", random_bytes, size_mb=20)
    with rawdev.claim(dev, force=True) as c:
        assert c.path == dev and any("overwriting although it holds data" in n for n in c.notes)
    with pytest.raises(Exception, match="it holds data"):
        with rawdev.claim(dev, force=False):
            pass


@needs_root
def test_a_sigkilled_run_is_cleaned_up_by_the_next(images, private_tmp):
    """SIGKILL mid-bench leaves a mount, loop devices, a running harness and the dir; the next run removes them."""
    tag = str(private_tmp)
    before = SandboxState.take()
    p = popen("bench", "storage", "--quick", "--engine", "sync", tmp=private_tmp)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not ours([f"mounts added: {m}" for m in SandboxState.take().mounts], tag):
        time.sleep(0.05)
    p.kill()                                # at once: the bench unmounts and remounts between phases
    p.wait()
    left = ours(before.diff(SandboxState.take()), tag)
    assert any(l.startswith("loops added") for l in left), left       # a mount too, unless caught between phases
    assert tmp_left(private_tmp)
    dev = images.make("data", random_bytes, size_mb=20)
    q = pt("bench", "storage", "--quick", "--device", dev, tmp=private_tmp)
    one_line_error(q, "it holds data")
    assert "left by a killed run" in q.stderr and f"(pid {p.pid})" in q.stderr
    assert ours(before.diff(SandboxState.take()), tag) == []
    assert tmp_left(private_tmp) == []
    stray = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    assert stray == [], "a harness of the killed run is still running"


def test_a_run_dir_under_nohup_leaves_sighup_ignored(tmp_path, monkeypatch):
    """nohup asked for SIGHUP to be ignored: a probe's run dir must not turn a hangup into an
    interrupt, still catches SIGTERM, and puts back what it found."""
    from proxytune.core import rundir
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None
    found = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    term = signal.getsignal(signal.SIGTERM)
    try:
        with rundir.RunDir("storage"):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is rundir._interrupt
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is term
    finally:
        signal.signal(signal.SIGHUP, found)
        tempfile.tempdir = None


@needs_root
def test_a_live_runs_sandbox_is_not_touched(private_tmp):
    """Another run's dir whose owner lives (this test) is not ours to remove; one without an owner file neither."""
    from proxytune.core import rundir
    os.environ["TMPDIR"] = str(private_tmp)
    tempfile.tempdir = None
    try:
        with rundir.RunDir("storage") as live:
            stranger = private_tmp / "proxytune-storage-notours"
            stranger.mkdir()
            assert rundir.reap_dead("storage") == []
            assert live.path.exists() and stranger.exists()
            (stranger / "owner").write_text("1 0 not-this-boot\n")
            os.chmod(stranger, 0o777)                  # writable by others: never trusted
            assert rundir.reap_dead("storage") == [] and stranger.exists()
            os.chmod(stranger, 0o700)
            assert len(rundir.reap_dead("storage")) == 1 and not stranger.exists()
        assert not live.path.exists()
    finally:
        del os.environ["TMPDIR"]
        tempfile.tempdir = None


# ------------------------------------------------------------------ doctor / probe targets

def zombie(name: bytes = b"zomb") -> tuple[subprocess.Popen, int]:
    """A parent that never reaps its child (which renamed itself to `name` and exited)."""
    code = ("import ctypes, os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            f"    ctypes.CDLL(None).prctl(15, {name!r}, 0, 0, 0)\n"
            "    os._exit(0)\n"
            "print(pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.02)
    return parent, pid


def kernel_thread() -> int:
    """A kernel thread other than kthreadd: a child of pid 2."""
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: (len(p.name), p.name)):
        if entry.name.isdigit() and int(entry.name) > 2:
            try:
                if entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1] == "2":
                    return int(entry.name)
            except OSError:
                continue
    pytest.skip("no kernel thread visible (a pid namespace?)")


@pytest.mark.parametrize("args", [["doctor"], ["probe", "run", "pollscan"], ["probe", "hotspots"]])
def test_a_zombie_is_refused_with_one_line(args, private_tmp):
    parent, pid = zombie()
    try:
        p = pt(*args, "--pid", str(pid), "-d", "1", tmp=private_tmp)
        one_line_error(p, f"refusing to watch pid {pid} (zomb): it is a zombie")
    finally:
        parent.kill()
        parent.wait()
    assert tmp_left(private_tmp) == []


def test_a_zombie_named_with_a_newline_is_still_one_line(private_tmp):
    parent, pid = zombie(b"z\nproxytune: ok")
    try:
        p = pt("doctor", "--pid", str(pid), tmp=private_tmp)
        one_line_error(p, f"refusing to watch pid {pid} (z\\x0aproxytune: ok): it is a zombie")
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("which", ["kthreadd", "child of kthreadd"])
def test_a_kernel_thread_is_refused_never_a_finding(which, private_tmp):
    pid = 2 if which == "kthreadd" else kernel_thread()
    p = pt("doctor", "--pid", str(pid), "--json", tmp=private_tmp)
    one_line_error(p, f"refusing to watch pid {pid} (")
    assert "it is a kernel thread" in p.stderr and "low-nofile-limit" not in p.stdout + p.stderr
    assert tmp_left(private_tmp) == []


@pytest.mark.parametrize("target, words", [
    (["--comm", "kthreadd"], "no process named 'kthreadd' can be watched: pid 2 (kthreadd): it is a kernel thread"),
    (["--pid", "0"], "--pid must be a positive process id, not 0"),
    (["--pid", "-7"], "--pid must be a positive process id, not -7"),
    (["--comm", "no\nsuch"], "no running process named 'no\\nsuch'"),
])
def test_a_target_that_names_no_user_process_is_one_line(target, words, private_tmp):
    p = pt("probe", "run", "pollscan", *target, "-d", "1", tmp=private_tmp)
    one_line_error(p, words)
    assert tmp_left(private_tmp) == []


@pytest.mark.parametrize("value", ["1e9", "nan", "-1", "0", "inf", "-inf", "3601", "ten", "1e-400"])
@pytest.mark.parametrize("args", [["doctor", "--pid", "1"], ["probe", "run", "pollscan", "--pid", "1"],
                                  ["probe", "hotspots", "--pid", "1"]])
def test_every_duration_is_validated(args, value, private_tmp):
    p = pt(*args, "-d", value, tmp=private_tmp, timeout=60)
    one_line_error(p, "--duration must be")
    assert tmp_left(private_tmp) == []


def test_probe_overhead_seconds_are_validated(private_tmp):
    one_line_error(pt("probe", "overhead", "--seconds", "nan", tmp=private_tmp), "--duration must be")


FAKE = {"bpftrace": "#!/bin/sh\necho 'ERROR: injected attach failure' >&2\nexit 1\n",
        "perf": "#!/bin/sh\n[ \"$1\" = record ] && exit 3\nexec /usr/bin/perf \"$@\"\n"}


@needs_root
@pytest.mark.parametrize("tool, args, words", [
    ("bpftrace", ["probe", "run", "pollscan"], "bpftrace did not attach: ERROR: injected attach failure"),
    ("perf", ["probe", "hotspots"], "perf record wrote nothing"),
])
def test_a_failing_tracer_is_one_line_and_leaves_no_files(tool, args, words, private_tmp, tmp_path):
    """Fault injection: the tracer itself fails (a stand-in earlier on PATH); the error path cleans up too."""
    (tmp_path / tool).write_text(FAKE[tool])
    (tmp_path / tool).chmod(0o755)
    target = sleeper()
    try:
        env = {**os.environ, "TMPDIR": str(private_tmp), "PATH": f"{tmp_path}:{os.environ['PATH']}"}
        p = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), *args, "--pid", str(target.pid),
                            "-d", "1"], capture_output=True, text=True, env=env, timeout=120)
        one_line_error(p, words)
        assert tmp_left(private_tmp) == [] and target.poll() is None
    finally:
        target.kill()
        target.wait()


def test_a_recycled_pid_is_not_the_same_process():
    """Identity is pid + start time: the same pid with another start time counts as exited."""
    from proxytune.core import procfs
    from proxytune.probes import target
    child = sleeper()
    try:
        start = procfs.read_stat(child.pid).start
        assert procfs.alive(child.pid, start) and not procfs.alive(child.pid, start + 1)
        w = target.Watch([child.pid])
        w.ids[child.pid] += 1                         # as if the pid now belonged to a later process
        w.poll(1.5)
        assert w.all_gone and w.exited == {child.pid: 1.5}
    finally:
        child.kill()
        child.wait()
    assert not procfs.alive(child.pid, start)


def sleeper(seconds: int = 60) -> subprocess.Popen:
    return subprocess.Popen(["sleep", str(seconds)])


def tracers_of(tmp: Path) -> list[str]:
    return subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split()


def run_files(tmp: Path) -> list[Path]:
    return [p for p in tmp.rglob("*") if p.name in ("program.bt", "perf.data")]


@needs_tracers
@pytest.mark.parametrize("sig, args", [
    (signal.SIGINT, ["doctor", "--json"]),
    (signal.SIGTERM, ["doctor", "--json"]),
    (signal.SIGINT, ["probe", "hotspots"]),
    (signal.SIGTERM, ["probe", "run", "pollscan"]),
])
def test_interrupted_probe_reaps_tracers_and_removes_its_files(sig, args, private_tmp, tmp_path):
    target = sleeper()
    cwd_before = sorted(os.listdir(tmp_path))
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    try:
        p = subprocess.Popen([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), *args, "--pid", str(target.pid),
                              "-d", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=tmp_path)
        expect = "program.bt" if "hotspots" not in args else "perf.data"
        assert wait_for(lambda: any(f.name == expect for f in run_files(private_tmp))), "the probe never started"
        assert wait_for(lambda: len(tracers_of(private_tmp)) >= 1)
        time.sleep(1)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130, err[-2000:]
        assert "Traceback" not in err and err.strip().splitlines()[-1] == "proxytune: interrupted"
        assert wait_for(lambda: not tracers_of(private_tmp), 10), tracers_of(private_tmp)
        assert tmp_left(private_tmp) == []
        assert sorted(os.listdir(tmp_path)) == cwd_before          # no perf.data in the working directory
        assert target.poll() is None                                # the target was not harmed
    finally:
        target.kill()
        target.wait()


@needs_tracers
def test_a_target_exiting_mid_window_is_a_clear_line(private_tmp):
    target = sleeper(6)
    p = pt("doctor", "--pid", str(target.pid), "-d", "60", "--no-perf", tmp=private_tmp, timeout=120)
    target.wait()
    one_line_error(p, f"the target (pid {target.pid}) exited ")
    assert "s into the 60 s window" in p.stderr
    assert tmp_left(private_tmp) == [] and not tracers_of(private_tmp)


@needs_tracers
def test_a_sigkilled_probe_leaves_no_tracer_and_the_next_run_removes_its_dir(private_tmp):
    target = sleeper()
    try:
        p = popen("probe", "hotspots", "--pid", str(target.pid), "-d", "60", tmp=private_tmp)
        assert wait_for(lambda: any(f.name == "perf.data" for f in run_files(private_tmp)))
        p.kill()
        p.wait()
        assert wait_for(lambda: not tracers_of(private_tmp), 10), "perf outlived the killed probe"
        assert [n for n in tmp_left(private_tmp) if n.startswith("proxytune-probe-")]
        r = pt("probe", "hotspots", "--pid", str(target.pid), "-d", "0.5", "--json", tmp=private_tmp, timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["data"]["probe"] == "hotspots"
        assert tmp_left(private_tmp) == []
    finally:
        target.kill()
        target.wait()


def test_probe_caps_runs_as_nobody_and_says_what_needs_root(as_nobody):
    """As an unprivileged user (setpriv), from a world-readable copy run by Debian's python3."""
    for extra in (["--json"], []):
        p = as_nobody("probe", "caps", *extra)
        assert "Traceback" not in p.stderr and p.returncode == 1, p.stderr[-2000:]
        if extra:
            c = json.loads(p.stdout)["data"]["capabilities"]
            assert c["root"]["ok"] is False and "need root" in c["root"]["detail"]
            assert "`sudo proxytune ...`" in c["root"]["detail"]       # installed: no ./proxytune
            assert c["tracefs"]["needs_root"] and not c["tracefs"]["ok"]
            assert c["perf_sampling"]["needs_root"]
            assert all(not v["needs_root"] for k, v in c.items() if k not in ("root", "tracefs", "bpftrace",
                                                                              "kprobes", "perf_sampling"))
        else:
            assert "need root" in p.stdout
