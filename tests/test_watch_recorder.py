"""The watcher's flight recorder under attack: torn tails, flipped bytes, planted symlinks,
a full disk, kill -9 mid-write, two writers, and its cap."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import IS_ROOT, REPO, needs_root, wait_for
from proxytune.core.errors import ProxytuneError
from proxytune.probes import recorder
from proxytune.tune import files

CAP = 256 << 10
# A child process that imports the checkout as `proxytune` (as conftest does)
PRELUDE = textwrap.dedent(f"""
    import importlib.machinery, importlib.util, sys
    sys.path.insert(0, {str(REPO)!r})
    spec = importlib.machinery.ModuleSpec("proxytune", None, is_package=True)
    spec.submodule_search_locations = [{str(REPO)!r}]
    sys.modules["proxytune"] = importlib.util.module_from_spec(spec)
    from proxytune.probes import recorder
""")


def rec(i: int, pad: int = 100) -> dict:
    return {"seq": i, "findings": [{"id": "haproxy-maxconn", "evidence": {"n": i}}], "pad": os.urandom(pad).hex()}


def write_n(path, n, cap=CAP, pad=100):
    with recorder.Recorder(path, cap) as r:
        for i in range(n):
            assert r.append(rec(i, pad))
    return r


def segments(path):
    return sorted(p for p in path.iterdir() if p.name.endswith(".seg"))


def test_records_come_back_in_order(tmp_path):
    write_n(tmp_path / "ring", 50)
    got = recorder.read(tmp_path / "ring")
    assert [r["seq"] for r in got.records] == list(range(50))
    assert got.damaged_segments == [] and got.dropped_bytes == 0
    assert oct((tmp_path / "ring").stat().st_mode & 0o777) == "0o700"
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in segments(tmp_path / "ring"))


def test_a_reading_since_a_time_skips_the_segments_last_written_before_it(tmp_path):
    """`watch status` over 15 minutes read every segment of the ring (256 MiB by default: seconds and
    hundreds of MiB, past a Nagios check's timeout). Segments last written before the span are left
    unread now; the ones after are read whole."""
    ring = tmp_path / "ring"
    write_n(ring, 400, pad=400)
    segs = segments(ring)
    assert len(segs) >= 4
    hour_ago = time.time() - 3600
    for p in segs[:-2]:
        os.utime(p, (hour_ago, hour_ago))
    recent = recorder.read(ring, since=time.time() - 600)
    kept = sum(len(recorder.scan(p.read_bytes(), True).records) for p in segs[-2:])
    assert [r["seq"] for r in recent.records] == list(range(400 - kept, 400)) and kept < 400
    assert len(recorder.read(ring, since=hour_ago - 2 * recorder.SINCE_SLACK_S).records) == len(recorder.read(ring).records)


def test_a_torn_last_record_is_dropped_never_misread(tmp_path):
    ring = tmp_path / "ring"
    write_n(ring, 10)
    seg = segments(ring)[-1]
    whole = seg.read_bytes()
    for cut in (1, recorder.HEADER.size - 1, recorder.HEADER.size + 3, 40):
        seg.write_bytes(whole[:-cut])
        got = recorder.read(ring)
        assert [r["seq"] for r in got.records] == list(range(9)), cut
        assert got.damaged_segments == [seg.name] and got.dropped_bytes > 0


def test_a_flipped_byte_costs_that_record_only(tmp_path):
    ring = tmp_path / "ring"
    write_n(ring, 10)
    seg = segments(ring)[-1]
    data = bytearray(seg.read_bytes())
    starts = [i for i in range(len(data)) if data.startswith(recorder.MAGIC, i)]
    assert len(starts) == 10
    for where in (starts[4] + recorder.HEADER.size + 5, starts[4] + 5, starts[4] + 9):   # payload, length, crc
        bad = bytearray(data)
        bad[where] ^= 0x40
        seg.write_bytes(bytes(bad))
        got = recorder.read(ring)
        assert [r["seq"] for r in got.records] == [0, 1, 2, 3, 5, 6, 7, 8, 9], where
        assert got.damaged_segments == [seg.name]


def test_a_new_writer_starts_a_new_segment_after_a_torn_tail(tmp_path):
    ring = tmp_path / "ring"
    write_n(ring, 3)
    seg = segments(ring)[-1]
    seg.write_bytes(seg.read_bytes()[:-7])
    with recorder.Recorder(ring, CAP) as r:
        assert r.append(rec(99))
    assert len(segments(ring)) == 2
    assert [r["seq"] for r in recorder.read(ring).records] == [0, 1, 99]


def test_the_cap_is_respected_and_the_oldest_go(tmp_path):
    ring = tmp_path / "ring"
    cap = 128 << 10
    write_n(ring, 400, cap=cap, pad=400)          # ~1 KiB a record (random hex does not compress much)
    total = sum(p.stat().st_size for p in segments(ring))
    assert total <= cap
    seqs = [r["seq"] for r in recorder.read(ring).records]
    assert seqs == list(range(seqs[0], 400)) and seqs[0] > 100 and len(seqs) > 60


def test_a_cap_below_the_minimum_is_one_clear_error(tmp_path):
    with pytest.raises(ProxytuneError, match="at least"):
        recorder.Recorder(tmp_path / "ring", 1000)


def test_two_writers_refuse_to_share(tmp_path):
    ring = tmp_path / "ring"
    with recorder.Recorder(ring, CAP):
        with pytest.raises(ProxytuneError, match=rf"another watcher \(pid {os.getpid()}\)"):
            recorder.Recorder(ring, CAP).__enter__()
    with recorder.Recorder(ring, CAP) as r:         # released on exit
        assert r.append(rec(1))


def test_two_writer_processes_refuse_to_share(tmp_path):
    ring = tmp_path / "ring"
    child = PRELUDE + textwrap.dedent(f"""
        from proxytune.core.errors import ProxytuneError
        try:
            recorder.Recorder({str(ring)!r}, {CAP}).__enter__()
        except ProxytuneError as e:
            print(e.message); sys.exit(3)
    """)
    with recorder.Recorder(ring, CAP):
        p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "another watcher" in p.stdout, p.stderr


def test_a_symlinked_ring_directory_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "ring").symlink_to(elsewhere)
    with pytest.raises(ProxytuneError, match="symlink"):
        recorder.Recorder(tmp_path / "ring", CAP).__enter__()
    with pytest.raises(ProxytuneError, match="symlink"):
        recorder.read(tmp_path / "ring")
    assert list(elsewhere.iterdir()) == []


def test_a_symlinked_parent_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ProxytuneError, match="symlink"):
        recorder.Recorder(tmp_path / "link" / "ring", CAP).__enter__()
    assert list(real.iterdir()) == []


def test_a_planted_segment_symlink_is_never_followed(tmp_path):
    ring = tmp_path / "ring"
    write_n(ring, 2)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    nxt = ring / "000000000009.seg"
    nxt.symlink_to(victim)
    with pytest.raises(ProxytuneError, match="000000000009.seg"):
        recorder.Recorder(ring, CAP).__enter__()       # the writer refuses the ring
    got = recorder.read(ring)                            # the reader skips it and says so
    assert [r["seq"] for r in got.records] == [0, 1] and "000000000009.seg" in got.damaged_segments
    assert victim.read_bytes() == b"precious"


def test_append_refuses_a_hard_link_and_a_symlink(tmp_path):
    d = tmp_path / "d"
    dfd = files.open_private_dir(d)
    try:
        victim = tmp_path / "victim"
        victim.write_bytes(b"x")
        os.link(victim, d / "hard")
        (d / "soft").symlink_to(victim)
        for name in ("hard", "soft"):
            with pytest.raises(ProxytuneError):
                files.open_append(dfd, name, d)
        with pytest.raises(ProxytuneError, match="plain name"):
            files.open_append(dfd, "../escape", d)
    finally:
        os.close(dfd)
    assert victim.read_bytes() == b"x"


def test_a_ring_directory_others_can_write_is_refused(tmp_path):
    ring = tmp_path / "ring"
    ring.mkdir()
    ring.chmod(0o777)
    with pytest.raises(ProxytuneError, match="writable by others"):
        recorder.Recorder(ring, CAP).__enter__()


def test_injected_enospc_keeps_the_writer_going_and_leaves_no_partial_record(tmp_path, monkeypatch):
    ring = tmp_path / "ring"
    with recorder.Recorder(ring, CAP) as r:
        assert r.append(rec(0))
        real_write, calls = os.write, []

        def half_then_full(fd, data):
            calls.append(fd)
            if len(calls) == 1:
                return real_write(fd, bytes(data[:len(data) // 2]))
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(os, "write", half_then_full)
        assert not r.append(rec(1))
        assert "No space left" in r.last_error and r.dropped == 1
        monkeypatch.setattr(os, "write", real_write)
        assert r.append(rec(2)) and r.last_error is None
    got = recorder.read(ring)
    assert [x["seq"] for x in got.records] == [0, 2] and got.dropped_bytes == 0


FULL_DISK = PRELUDE + textwrap.dedent("""
    import json, os
    ring = sys.argv[1] + "/ring"
    out = {"ok": 0, "refused": 0, "errors": set()}
    with recorder.Recorder(ring, 1 << 20) as r:      # the cap is above the filesystem's size
        for i in range(400):
            if r.append({"seq": i, "pad": os.urandom(600).hex()}):
                out["ok"] += 1
            else:
                out["refused"] += 1
                out["errors"].add(r.last_error)
    got = recorder.read(ring)
    out["read"] = [x["seq"] for x in got.records]
    out["dropped_bytes"] = got.dropped_bytes
    out["errors"] = sorted(out["errors"])
    print(json.dumps(out))
""")


@needs_root
def test_a_full_filesystem_costs_records_not_the_writer(tmp_path):
    """A real tmpfs of 128 KiB, mounted in a private mount namespace (gone with it)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f'mount -t tmpfs -o size=128k,mode=0700 pt-full "$1" && exec {sys.executable} -c "$2" "$1"'
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(mnt), FULL_DISK],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    import json
    out = json.loads(p.stdout)
    assert out["ok"] > 20 and out["refused"] > 100
    assert all("No space left" in e for e in out["errors"])
    assert out["dropped_bytes"] == 0 and out["read"] == sorted(out["read"]) and len(out["read"]) == out["ok"]
    assert list(mnt.iterdir()) == []                  # the namespace's mount never reached the host


KILLED = PRELUDE + textwrap.dedent("""
    import os
    with recorder.Recorder(sys.argv[1], 4 << 20) as r:
        i = 0
        while True:
            r.append({"seq": i, "pad": os.urandom(20000).hex()})   # ~40 KB: kill -9 lands mid-write often
            print(i, flush=True)                                    # appended: it must be there
            i += 1
""")


@pytest.mark.parametrize("after", [0.05, 0.2, 0.5])
def test_kill_9_mid_write_leaves_a_readable_ring(tmp_path, after):
    ring = tmp_path / "ring"
    p = subprocess.Popen([sys.executable, "-c", KILLED, str(ring)], stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: p.stdout.readline().strip() == "4", 30)
        time.sleep(after)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    appended = int(([line for line in p.stdout.read().split() if line.isdigit()] or ["4"])[-1])
    got = recorder.read(ring)
    seqs = [r["seq"] for r in got.records]
    assert len(seqs) >= 5 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    # every append that returned is there; the one under way when it was killed may be, whole, or not
    assert seqs[-1] in (appended, appended + 1), (seqs[-1], appended)
    # the damage is a torn tail, nothing before it
    assert got.damaged_segments in ([], [segments(ring)[-1].name])
    with recorder.Recorder(ring, 4 << 20) as r:        # the kernel dropped the lock with the writer
        assert r.append(rec(-1))
    assert recorder.read(ring).records[-1]["seq"] == -1


def test_a_segment_that_cannot_be_made_costs_the_record_not_the_writer(tmp_path):
    ring = tmp_path / "ring"
    with recorder.Recorder(ring, recorder.MIN_CAP) as r:
        i = 0
        while r.current is None or r.current == "000000000001.seg":
            assert r.append(rec(i, 300))
            i += 1
        victim = tmp_path / "victim"
        victim.write_bytes(b"precious")
        (ring / "000000000003.seg").symlink_to(victim)      # where the next segment goes
        while r.append(rec(i, 300)):
            i += 1
        assert "symlink" in r.last_error and r.dropped == 1
    assert victim.read_bytes() == b"precious"


def test_heads_only_still_checks_the_body_and_load_gets_it_back(tmp_path):
    ring = tmp_path / "ring"
    bodies = [{"pad": os.urandom(500).hex(), "i": i} for i in range(3)]     # ~600 bytes compressed
    with recorder.Recorder(ring, CAP) as r:
        for i in range(3):
            assert r.append({"seq": i, "body": bodies[i]})
    heads = recorder.read(ring, whole=False).records
    assert [("body" in h, h["seq"]) for h in heads] == [(False, 0), (False, 1), (False, 2)]
    assert recorder.load(ring, heads[1]["_at"]) == {"seq": 1, "body": bodies[1]}
    for bad in (["../../etc/passwd", 0], [heads[1]["_at"][0], heads[1]["_at"][1] + 1], ["000000000099.seg", 0],
                [heads[1]["_at"][0], -5]):
        assert recorder.load(ring, bad) is None, bad
    seg = segments(ring)[-1]
    data = bytearray(seg.read_bytes())
    data[heads[1]["_at"][1] + recorder.HEADER.size + 60] ^= 1       # inside record 1's compressed body
    seg.write_bytes(bytes(data))
    assert [h["seq"] for h in recorder.read(ring, whole=False).records] == [0, 2]
