"""Issue 20: what root writes that is not a tuning change (reports, results, exports, the
harness build cache), and untrusted text shown to a person.

The threat is a local user: `nobody` (setpriv) plants symlinks and directories
where root's reports, results and caches go, then root runs the real code path.
Then hostile strings (terminal escapes, rich markup, Markdown links and images,
HTML, table pipes, newlines, Unicode digits) from result files and fleet hosts
go through every renderer.
"""

import io
import json
import math
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, needs_root
from test_adversarial_profiles import nobody_dir  # noqa: F401
from proxytune.core.errors import ProxytuneError

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
HOSTILE = ["\x1b[2Jwiped", "\x1b]0;title\x07", "[/]", "[bold red]x", "![x](http://a/b)",
           "[c](javascript:alert(1))", "<script>alert(1)</script>", "a|b", "two\nlines", "tab\there",
           "<javascript:alert(2)>", "`code`"]
RESULTS = REPO / "docs" / "results"


@pytest.fixture
def arena():
    """A root-owned 0755 directory under /tmp (pytest's own tmp is 0700: nobody could not reach it)
    holding `home`, owned by nobody (the attacker's directory, where root runs), and `vault`, a
    root-only directory with a root-only file in it (what the attacker wants overwritten)."""
    base = Path(tempfile.mkdtemp(prefix="proxytune-writes-", dir="/tmp"))
    try:
        base.chmod(0o755)
        home, vault = base / "home", base / "vault"
        home.mkdir()
        nobody = pwd.getpwnam("nobody")
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        vault.mkdir(mode=0o700)
        for name in ("secret", "report.md", "compare.md", "fleet.md", "report.json"):
            (vault / name).write_text("root only\n")
            (vault / name).chmod(0o600)
        yield base
    finally:
        shutil.rmtree(base)


def proxytune(*args, cwd=None):
    """The real CLI as root, in `cwd` (the directory root runs in)."""
    return subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def as_nobody(script: str, cwd: Path) -> None:
    subprocess.run([*AS_NOBODY, "sh", "-c", script], cwd=cwd, check=True)


def vault_intact(base: Path) -> None:
    for f in (base / "vault").iterdir():
        assert f.read_text() == "root only\n", f
        assert stat.S_IMODE(f.stat().st_mode) == 0o600 and f.stat().st_uid == 0


def refused(r) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("proxytune: error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def two_results(base: Path) -> list[str]:
    """Two real result files in a root-owned place."""
    out = []
    for name in ("fdscan-full.json", "events-full.json"):
        shutil.copy(RESULTS / name, base / name)
        out.append(str(base / name))
    return out


# ------------------------------------------------------------ class 2: writes through planted paths

@needs_root
def test_report_compare_refuses_a_symlink_planted_in_its_output_dir(arena):
    """nobody owns the directory root runs in; variant 1: the output dir is nobody's, with
    compare.md a link to a root-only file; variant 2: the output dir itself is a link to a root-only dir."""
    files = two_results(arena)
    home = arena / "home"
    as_nobody("mkdir proxytune-compare && ln -s ../../vault/compare.md proxytune-compare/compare.md", home)
    line = refused(proxytune("report", "compare", *files, cwd=home))
    assert "proxytune-compare" in line and "owned by" in line
    shutil.rmtree(home / "proxytune-compare")
    as_nobody("ln -s ../vault proxytune-compare", home)
    line = refused(proxytune("report", "compare", *files, cwd=home))
    assert "symlink" in line and "proxytune-compare" in line
    vault_intact(arena)
    assert sorted(p.name for p in (arena / "vault").iterdir()) == ["compare.md", "fleet.md", "report.json",
                                                                   "report.md", "secret"]


@needs_root
def test_report_fleet_refuses_planted_links(arena):
    """Variant 1: fleet.md is a link in root's own output dir: refused, not followed (the link stays);
    variant 2: -o names a link (in nobody's directory) to a root-only dir."""
    fleet = arena / "fleet.json"
    fleet.write_text(json.dumps(fleet_doc({"px1": host_entry("px1")})))
    out = arena / "out"
    out.mkdir(mode=0o700)
    (out / "fleet.md").symlink_to(arena / "vault" / "fleet.md")
    line = refused(proxytune("report", "fleet", str(fleet), "-o", str(out)))
    assert "symlink" in line and "fleet.md" in line and (out / "fleet.md").is_symlink()
    (out / "fleet.md").unlink()
    (out / "fleet.html").symlink_to(arena / "vault" / "secret")      # the second file: the first is not written
    line = refused(proxytune("report", "fleet", str(fleet), "-o", str(out)))
    assert "fleet.html" in line and not (out / "fleet.md").exists()
    as_nobody("ln -s ../vault fleetdir", arena / "home")
    line = refused(proxytune("report", "fleet", str(fleet), "-o", str(arena / "home" / "fleetdir")))
    assert "symlink" in line
    vault_intact(arena)


@needs_root
def test_report_written_into_a_planted_dir_or_through_a_planted_link_is_refused(arena, monkeypatch):
    """`report` writes via build.write_doc: variant 1 nobody pre-creates proxytune-report/report.md
    as a link; variant 2 proxytune-report is a link to the root-only dir."""
    from proxytune.reports import build
    doc = json.loads((RESULTS / "report-with-proxy.json").read_text())
    home = arena / "home"
    monkeypatch.chdir(home)
    as_nobody("mkdir proxytune-report && ln -s ../../vault/report.md proxytune-report/report.md", home)
    with pytest.raises(ProxytuneError, match="owned by"):
        build.write_doc(doc, Path("proxytune-report"))
    shutil.rmtree(home / "proxytune-report")
    as_nobody("ln -s ../vault proxytune-report", home)
    with pytest.raises(ProxytuneError, match="symlink"):
        build.write_doc(doc, Path("proxytune-report"))
    vault_intact(arena)


@needs_root
def test_report_is_refused_before_it_runs_anything(arena, monkeypatch, sandbox):
    """`report` in nobody's directory with their proxytune-report/ planted: refused before the audit
    and the benches start (not after minutes of benches); the CLI says it in one line."""
    from proxytune.reports import build
    home = arena / "home"
    as_nobody("mkdir proxytune-report", home)
    monkeypatch.chdir(home)
    ran = []
    monkeypatch.setattr(build, "collect", lambda *a, **k: ran.append(a) or ({}, {}))
    with pytest.raises(ProxytuneError, match="proxytune-report: it is owned by uid"):
        build.write_report(sandbox, "linux/proxy", Path("proxytune-report"))
    assert ran == []
    line = refused(proxytune("report", "--no-bench", cwd=home))
    assert "proxytune-report: it is owned by uid" in line


@needs_root
def test_bench_result_and_export_refuse_planted_links(arena, monkeypatch, sandbox):
    """A bench result's default proxytune-results/ and `tune export -o`: variant 1 the results dir is a
    link nobody planted; variant 2 -o is a link nobody planted in their own directory."""
    from proxytune.reports import benchresult
    home = arena / "home"
    monkeypatch.chdir(home)
    as_nobody("ln -s ../vault proxytune-results && ln -s ../vault/secret out.conf", home)
    data = json.loads((RESULTS / "fdscan-full.json").read_text())["data"]
    with pytest.raises(ProxytuneError, match="symlink"):
        benchresult.store("fdscan", data, None)
    r = proxytune("tune", "export", "--format", "sysctl.d", "--only", "sysctl:net.core.somaxconn", "-o", "out.conf",
                  cwd=home)
    line = refused(r)
    assert "home: it is owned by uid" in line
    vault_intact(arena)


@needs_root
def test_output_dir_writable_by_others_is_refused_and_sticky_one_is_not(arena):
    """A root-owned 0777 directory (anyone can swap names in it) is refused; a 1777 one (like /tmp) is not."""
    from proxytune.tune import files
    open_dir = arena / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ProxytuneError, match="writable by others"):
        files.write_output(open_dir / "r.json", "{}\n")
    assert list(open_dir.iterdir()) == []
    open_dir.chmod(0o1777)
    files.write_output(open_dir / "r.json", "{}\n")
    assert (open_dir / "r.json").read_text() == "{}\n"


def test_outputs_are_atomic_and_new_dirs_private(tmp_path):
    """An existing report is replaced by a new inode (a hard link to the old one keeps the old text:
    no reader sees a half-written file); directories made for results are 0700; bytes work too."""
    from proxytune.tune import files
    out = tmp_path / "a" / "b" / "report.md"
    files.write_output(out, "old\n")
    os.link(out, tmp_path / "other-name")
    files.write_output(out, "new\n")
    assert out.read_text() == "new\n" and (tmp_path / "other-name").read_text() == "old\n"
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700
    files.write_output(tmp_path / "a" / "fig.png", b"\x89PNG")
    assert (tmp_path / "a" / "fig.png").read_bytes() == b"\x89PNG"
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == ["report.md"]     # no temp file left


def test_output_onto_a_directory_is_one_clear_error(tmp_path):
    from proxytune.tune import files
    (tmp_path / "d").mkdir()
    with pytest.raises(ProxytuneError, match="not a regular file"):
        files.write_output(tmp_path / "d", "x")


# ------------------------------------------------------------ medium: the harness build cache

@needs_root
def test_build_cache_under_a_dir_others_own_or_can_write_is_refused(arena, monkeypatch):
    """Variant 1: the cache's parent is nobody's (nobody could swap the binaries root runs);
    variant 2: a parent is root's but 0777 without the sticky bit; variant 3: nobody made the cache dir
    itself in a sticky directory."""
    from proxytune.tune.datafiles import cache_dir
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(arena / "home" / "cache"))
    with pytest.raises(ProxytuneError, match="home"):
        cache_dir()
    assert not (arena / "home" / "cache").exists()
    (arena / "open").mkdir()
    (arena / "open").chmod(0o777)
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(arena / "open" / "cache"))
    with pytest.raises(ProxytuneError, match="writable by others"):
        cache_dir()
    (arena / "open").chmod(0o1777)
    as_nobody("mkdir -m 700 cache", arena / "open")
    with pytest.raises(ProxytuneError, match="owned by"):
        cache_dir()


@needs_root
def test_build_cache_in_a_sticky_dir_is_ours_and_private(arena, monkeypatch):
    """In a sticky world-writable parent the cache dir must be ours and 0700 (made so when we make it):
    a 0755 one of ours there is refused, as is a 0777 one."""
    from proxytune.tune.datafiles import cache_dir
    (arena / "open").mkdir()
    (arena / "open").chmod(0o1777)
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(arena / "open" / "cache"))
    assert cache_dir() == arena / "open" / "cache"
    assert stat.S_IMODE((arena / "open" / "cache").stat().st_mode) == 0o700
    (arena / "open" / "cache").chmod(0o755)
    with pytest.raises(ProxytuneError, match="must be 0700, not 0755"):
        cache_dir()
    (arena / "open" / "cache").chmod(0o777)
    with pytest.raises(ProxytuneError, match="writable by others"):
        cache_dir()


@needs_root
@pytest.mark.skipif(any(p.stat().st_mode & stat.S_ISVTX for p in REPO.parents),
                    reason="the checkout is in a sticky directory")
def test_an_existing_cache_dir_is_never_chmodded(monkeypatch):
    """Outside a sticky directory an existing 0755 cache dir of ours is used as it is: a cache_dir()
    that tightened it would make / 0700 with PROXYTUNE_CACHE_DIR=/."""
    from proxytune.tune.datafiles import cache_dir
    shared = Path(tempfile.mkdtemp(prefix=".test-cache-", dir=REPO))     # no sticky dir above it
    try:
        shared.chmod(0o755)
        monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(shared))
        assert cache_dir() == shared and stat.S_IMODE(shared.stat().st_mode) == 0o755
    finally:
        shared.rmdir()


@needs_root
def test_build_cache_through_a_link_is_vetted_where_it_points(arena, monkeypatch):
    """A link root made (like a symlinked ~/.cache) is taken where it points, which is vetted; a link
    nobody planted to their own directory is refused for what it points to."""
    from proxytune.tune.datafiles import cache_dir
    (arena / "mine").mkdir(mode=0o700)
    (arena / "link").symlink_to(arena / "mine")
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(arena / "link" / "cache"))
    assert cache_dir() == arena / "mine" / "cache"
    as_nobody("mkdir theirs && ln -s theirs planted", arena / "home")
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(arena / "home" / "planted"))
    with pytest.raises(ProxytuneError, match="owned by"):
        cache_dir()


@needs_root
def test_a_harness_binary_someone_else_owns_is_never_run(tmp_path, monkeypatch):
    """A cached binary that is not ours (planted when the cache was open) is rebuilt, not returned."""
    from proxytune.microbench import build, fdscan
    monkeypatch.setenv("PROXYTUNE_CACHE_DIR", str(tmp_path / "cache"))
    first = build.build(fdscan.HARNESS)
    first.write_text("#!/bin/sh\necho planted\n")
    os.chown(first, pwd.getpwnam("nobody").pw_uid, -1)
    again = build.build(fdscan.HARNESS)
    assert again.stat().st_uid == 0 and b"planted" not in again.read_bytes()


def test_private_dir_is_the_api_for_state_dirs(tmp_path):
    """files.private_dir: made 0700 with its parents, every component vetted; a symlink is refused."""
    from proxytune.tune import files
    d = files.private_dir(tmp_path / "state" / "fleet")
    assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700
    (tmp_path / "link").symlink_to(tmp_path / "state")
    with pytest.raises(ProxytuneError, match="symlink"):
        files.private_dir(tmp_path / "link" / "fleet")


# ------------------------------------------------------------ Deliver 6: one escaping function per medium

def rendered_terminal(print_fn) -> str:
    from rich.console import Console
    buf = io.StringIO()
    print_fn(Console(file=buf, force_terminal=True, width=200, highlight=False, emoji=False))
    return buf.getvalue()


def no_terminal_attack(out: str) -> None:
    assert "\x1b[2J" not in out and "\x1b]0;" not in out and "\x07" not in out
    assert "two\nlines" not in out


@pytest.mark.parametrize("s", HOSTILE)
def test_terminal_text_escapes_controls_and_markup(s):
    from rich.text import Text
    from proxytune.core.console import term_text
    t = term_text(s)
    assert not re.search("[\x00-\x1f\x7f]", t)
    assert Text.from_markup(t).plain == term_text(s, markup=False)     # markup shown as written


@pytest.mark.host  # the host fingerprint runs systemd-detect-virt (the tier: tests/tiers.py)
def test_terminal_tables_sections_and_fleet_show_hostile_text_inert():
    from proxytune.core.console import print_section, rich_table
    from proxytune.core.sections import Section, Table
    from proxytune.reports import fleet as fleet_report
    sec = Section(HOSTILE[0], HOSTILE[1], [Table(HOSTILE[2], ["h", HOSTILE[3]], [[s, s] for s in HOSTILE])],
                  notes=list(HOSTILE))
    out = rendered_terminal(lambda c: print_section(sec, c))
    no_terminal_attack(out)
    assert "[/]" in out and "[bold red]x" in out
    data = fleet_doc({s: host_entry(s) for s in HOSTILE})["data"]
    out = rendered_terminal(lambda c: [c.print(rich_table(t, fleet_report._styled)) for t in fleet_report.tables(data)])
    no_terminal_attack(out)


def test_doctor_render_shows_hostile_comm_exe_and_config_inert(monkeypatch):
    """probes/render.py: a comm `[/]`, an exe with an ESC sequence, a config path with a title escape,
    reasons and evidence from the proxy."""
    from proxytune.probes import render
    buf = []
    monkeypatch.setattr(render, "console", lambda: _capture(buf))
    render.doctor_report(doctor_doc())
    out = "".join(b.getvalue() for b in buf)
    no_terminal_attack(out)
    assert "[/]" in out


def _capture(buf):
    from rich.console import Console
    buf.append(io.StringIO())
    return Console(file=buf[-1], force_terminal=True, width=200, highlight=False, emoji=False)


def doctor_doc() -> dict:
    evil = "[/]\x1b[2J\x1b]0;title\x07two\nlines"
    loop = {k: evil for k in ("waits_per_s", "events_per_s", "events_per_wait", "accepts_per_s", "cpu_cores",
                              "cpu_us_per_event")}
    return {"target": {"comm": "[/]", "pids": [1], "exited": {}}, "window_s": 1.0,
            "evidence": {"scripts": [evil], "perf": {"available": False, "reason": evil},
                         "proxy": {"kind": evil, "exe": "/x/\x1b[2Jnginx", "config": "/etc/\x1b]0;title\x07n.conf",
                                   "stats_after": {"available": False, "reason": evil}},
                         "skipped_scripts": {evil: evil}, "loop": loop,
                         "audit": {"available": True, "profile": evil, "drift": [
                             {"setting": evil, "current": evil, "wanted": evil}]}},
            "findings": [{"severity": "high", "id": evil, "title": evil, "evidence": {evil: evil}, "fix": evil}]}


def test_markdown_text_is_inert():
    from proxytune.reports.markdown import md_text
    for s in HOSTILE:
        t = md_text(s)
        assert "\n" not in t and "<script" not in t and "<javascript" not in t
        assert not re.search(r"(?<!\\)[\[\]`|!<]", t), t


def test_markdown_and_html_reports_of_hostile_results_are_inert(tmp_path):
    """report compare of results whose hostname, file name and cells are hostile."""
    from proxytune.reports import compare
    docs = []
    for i, s in enumerate(HOSTILE[:6]):
        d = json.loads((RESULTS / "fdscan-full.json").read_text())
        d["host"]["hostname"] = s
        docs.append(d)
    names = [Path(f"/r/{s}.json") for s in HOSTILE[:6]]
    md, html = compare.write(docs, names, tmp_path / "out")
    check_markdown(md.read_text())
    check_html(html.read_text())


@pytest.mark.host  # the host fingerprint runs systemd-detect-virt (the tier: tests/tiers.py)
def test_fleet_markdown_and_html_of_hostile_hosts_are_inert(tmp_path):
    from proxytune.reports import fleet as fleet_report
    doc = fleet_doc({s: host_entry(s) for s in HOSTILE})
    doc["data"]["fleet"] = "![x](http://a/b)"
    md, html = fleet_report.write(doc, tmp_path / "out")
    text = md.read_text()
    check_markdown(text)
    check_html(html.read_text())
    header = next(line for line in text.splitlines() if line.startswith("| setting"))
    assert header.count(" | ") == 1 + len(HOSTILE)       # one column per host: pipes in names escaped


def check_markdown(text: str) -> None:
    """No link or image (these pages draw none: every [ or ] is escaped), no raw HTML or autolink,
    no control character, no line break inside a value."""
    assert "\x1b" not in text and "\x07" not in text
    assert not re.search(r"(?<!\\)[\[\]]", text)
    assert "<script" not in text and "<javascript" not in text and "two\nlines" not in text


def check_html(text: str) -> None:
    assert "<script" not in text and "\x1b" not in text and "\x07" not in text


# ------------------------------------------------------------ Deliver 6: numbers from untrusted text

PRODUCT = [p for p in REPO.rglob("*.py") if not p.is_relative_to(REPO / "tests")
           and not any(part.startswith(".") for part in p.relative_to(REPO).parts)]


def test_no_isdigit_in_the_product():
    """str.isdigit / isnumeric / isdecimal accept '³' and '٣', which int() then refuses or misreads."""
    hits = [f"{p.relative_to(REPO)}:{i}" for p in PRODUCT for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"\.is(digit|numeric|decimal)\(", line)]
    assert hits == []


@pytest.mark.parametrize("value", ["³", "٣٠٠", "1²", "１０"])
def test_unicode_digits_in_proxy_config_are_not_numbers(value):
    from proxytune.core.numbers import uint
    assert uint(value) is None
    assert uint("300") == 300 and uint(" 3") is None and uint("") is None and uint(None) is None


@pytest.mark.parametrize("value", ["³", "١٠", "1²"])
def test_proxy_caps_with_unicode_digits_are_not_read_as_numbers(value):
    """A config value `maxconn ³` crashed the doctor (isdigit, then int); now it is not a cap at all,
    and nginx's worker_connections falls back to its default 512."""
    from proxytune.probes import proxies_findings as pf
    ev = {"proxy": {"directives": {"maxconn": {"value": value}, "worker_connections": {"value": value},
                                   "proxy.config.net.connections_throttle": {"value": value}}, "config": "/c"},
          "procs": {"1": {"fds_open": 600}}, "listeners": [], "conns": {"pids": {"1": {"sockets_peak": 600}}}}
    assert pf.caps({**ev, "proxy": {**ev["proxy"], "kind": "haproxy"}}) == []
    found = pf.own_findings({**ev, "proxy": {**ev["proxy"], "kind": "nginx"}}, {})
    assert [f.id for f in found] == ["nginx-worker-connections"] and found[0].evidence["limit"] == 512


# ------------------------------------------------------------ Low: renderers on odd but schema-valid results

def odd_fdscan(kind: str) -> dict:
    d = json.loads((RESULTS / "fdscan-full.json").read_text())
    if kind == "zero":
        for p in d["data"]["points"]:
            p["ns_per_call"]["median"] = 0
    elif kind == "nan":
        for p in d["data"]["points"]:
            p["ns_per_call"]["median"] = math.nan
    elif kind == "missing":         # fields the schema leaves optional
        for k in ("variants", "miss_ratio_1_over_3", "fastest_at_largest_n", "cachegrind_geometry"):
            d["data"].pop(k, None)
        d["data"]["misses"] = [{}]
    elif kind == "missing-required":
        for p in d["data"]["points"]:
            del p["ns_per_call"]["iqr_rel"]
    elif kind == "huge":
        d["data"]["points"] = [dict(d["data"]["points"][0], n=i) for i in range(1, 20001)]
    return d


@pytest.mark.parametrize("kind", ["zero", "nan", "missing", "missing-required", "huge"])
def test_compare_and_report_survive_odd_results(kind, tmp_path):
    """Schema-valid results with zero or NaN medians, no optional fields, or 20,000 points are rendered
    (n/a where a part cannot be); one that is not schema-valid is one clear line."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(odd_fdscan(kind)))
    shutil.copy(RESULTS / "events-full.json", b)
    r = proxytune("report", "compare", str(a), str(b), "-o", str(tmp_path / "c"))
    assert r.returncode in (0, 2) and "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    if r.returncode == 2:
        assert len(r.stderr.strip().splitlines()) <= 2
    r = proxytune("report", "--no-bench", "--from", str(a), "-o", str(tmp_path / "r"))
    assert r.returncode in (0, 1, 2) and "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    if kind == "missing-required":
        assert r.returncode == 2 and "not a proxytune result: 'iqr_rel' is a required property" in r.stderr
    else:
        assert r.returncode in (0, 1) and (tmp_path / "r" / "report.md").exists(), r.stderr


# ------------------------------------------------------------ Low: fdscan never records a failed harness's misses

def failing_harness(tmp_path: Path) -> Path:
    """A stand-in for the fdscan harness that fails at once (as a broken build or a refused --n would)."""
    exe = tmp_path / "fdscan-broken"
    exe.write_text("#!/bin/sh\necho 'fdscan: cannot allocate' >&2\nexit 3\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.skipif(not shutil.which("valgrind"), reason="needs valgrind")
@pytest.mark.host  # runs valgrind (the tier: tests/tiers.py)
def test_cachegrind_over_a_failed_harness_is_an_error_not_zero_misses(tmp_path):
    """cachegrind still prints D1 misses (the shell's) when the program fails: twice the same count,
    so 0.0 misses per call. Variant 1: the counter itself; variant 2: a whole run records no miss."""
    from proxytune.microbench import fdscan
    from proxytune.microbench.runner import HarnessError
    exe = failing_harness(tmp_path)
    with pytest.raises(HarnessError, match="exit 3"):
        fdscan.misses_per_call(exe, 1, 100, "cachegrind")


@pytest.mark.parametrize("source", ["cachegrind", "perf"])
@pytest.mark.host  # runs the failing harness (the tier: tests/tiers.py)
def test_a_run_with_a_failed_harness_records_no_misses(source, tmp_path, monkeypatch):
    from proxytune.core.capability import Capability
    from proxytune.microbench import fdscan
    if not shutil.which({"cachegrind": "valgrind", "perf": "perf"}[source]):
        pytest.skip(f"needs {source}")
    exe = failing_harness(tmp_path)
    monkeypatch.setattr(fdscan, "build", lambda name: exe)
    monkeypatch.setattr(fdscan, "perf_counts", lambda event: Capability(source == "perf", "test"))
    monkeypatch.setitem(fdscan.QUICK, "ns", [100])
    r = fdscan.run(quick=True, quiet=True)
    assert r["misses"] == [] and r["points"] == []
    assert {p["mode"] for p in r["unavailable_points"]} == {"time", "misses"}
    reasons = [p["reason"] for p in r["unavailable_points"]]
    assert all("exit 3" in why or "failed" in why for why in reasons), reasons


@pytest.mark.host  # runs a stand-in perf over the failing harness (the tier: tests/tiers.py)
def test_a_counter_that_exits_0_over_a_failed_harness_gives_no_count(tmp_path, monkeypatch):
    """Whether perf stat passes its workload's exit status on is perf's business (a CI host's perf
    exited 0 over the failing harness): only the harness's own printed result says it ran."""
    from proxytune.microbench import fdscan
    from proxytune.microbench.runner import HarnessError
    exe = failing_harness(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    perf = bin_dir / "perf"                # runs the workload, ignores its status, prints a count
    perf.write_text('#!/bin/sh\nshift 4\n"$@" >/dev/null 2>&1\necho "12345,,L1-dcache-load-misses,100,100.00,," >&2\n')
    perf.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(HarnessError, match="printed no result"):
        fdscan.misses_per_call(exe, 1, 100, "perf")


# ------------------------------------------------------------ Low: root running a checkout another user owns

from test_launcher import checkout  # noqa: E402,F401  (the launcher in a temp checkout, its fakes on PATH)


def test_root_running_a_checkout_nobody_owns_is_warned(checkout, tmp_path):
    """Variant 1: the checkout is nobody's; variant 2: a parent is root's but 0777 (not sticky);
    and a root-owned checkout says nothing. The command still runs (the operator may mean it)."""
    top = tmp_path / "checkout"
    r, _, python = checkout("profiles", "list")
    assert "warning: root is running" not in r.stderr and python
    os.chown(top, pwd.getpwnam("nobody").pw_uid, -1)
    r, _, python = checkout("profiles", "list")
    warned = [line for line in r.stderr.splitlines() if "warning: root is running a checkout" in line]
    assert len(warned) == 1 and f"uid {pwd.getpwnam('nobody').pw_uid}" in warned[0] and python
    os.chown(top, 0, -1)
    tmp_path.chmod(0o777)
    r, _, python = checkout("profiles", "list")
    assert f"{tmp_path} is writable by others" in r.stderr and python
    tmp_path.chmod(0o1777)
    r, _, _ = checkout("profiles", "list")
    assert "warning: root is running" not in r.stderr


# ------------------------------------------------------------ helpers

def host_entry(name: str) -> dict:
    return {"status": "ok", "fingerprint": None, "error": name,
            "settings": [{"setting": f"sysctl:{name}", "current": 1, "wanted": 2, "current_text": name,
                          "wanted_text": name, "mode": "min", "status": "drift", "reason": name, "source": name}]}


def fleet_doc(hosts: dict) -> dict:
    from proxytune.reports.schema import envelope
    return envelope("fleet", {"fleet": "f1", "profile": "linux/proxy", "hosts": hosts,
                              "summary": {"ok": len(hosts), "unreachable": 0, "failed": 0, "skipped": 0}, "exit": 0})


# ------------------------------------------- terminal escapes in error lines

@needs_root
def test_a_launcher_link_named_with_escapes_reaches_no_terminal(nobody_dir):
    """PROXYTUNE_PROG (kept by `sudo -E`) names a link to this checkout's launcher whose name holds
    ESC ] 0 ; ... BEL: it is believed (it resolves to the launcher) and quoted into the needs-root hint
    of a permission-denied error, which was printed raw: the terminal's title was rewritten."""
    link = nobody_dir / "pt-\x1b]0;pwned\x07"
    link.symlink_to(REPO / "proxytune")
    env = {**os.environ, "PROXYTUNE_PROG": str(link), "HOME": str(nobody_dir / "none"),
           "XDG_CONFIG_HOME": "/root/.config"}      # a directory nobody may list: PermissionError
    r = subprocess.run([*AS_NOBODY, str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "tune", "plan",
                        "-p", "linux/proxy"], capture_output=True, text=True, env=env, timeout=60)
    assert "may not use it" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "\\x1b]0;pwned\\x07" in r.stderr


@pytest.mark.parametrize("kind", ["error", "internal error"])
def test_every_error_line_is_one_inert_line(capsys, kind):
    """Whatever reaches say_error (an internal error's exception text quotes hostile input verbatim)."""
    from proxytune.cli import say_error
    say_error("bad \x1b[2J\rname\u202e", "run \x1b]0;t\x07 again", kind=kind)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err and "\u202e" not in err
    assert len(err.splitlines()) == 2


def test_a_catalog_file_named_with_escapes_is_warned_about_inertly(sandbox, cli):
    """A site profile whose file name holds ESC ] 0 ; ... BEL (unpacked from someone's tarball) is
    skipped; the warning saying so printed the name raw (its own sink, not say_error's)."""
    d = sandbox.root / "etc/proxytune/profiles"
    d.mkdir(parents=True)
    (d / "a\x1b]0;pwned\x07b.toml").write_text('[profile]\ndescription = "d"\nos = "linux"\n')
    r = cli("profiles", "list")
    assert "skipped" in r.output and "\\x1b]0;pwned\\x07" in r.output
    assert "\x1b]0;" not in r.output and "\x07" not in r.output
