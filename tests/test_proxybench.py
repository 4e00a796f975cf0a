"""bench proxy against Debian's squid and nginx on loopback, and the report
around it: the stores all serve and hit, a 1024-fd squid fails where the
tuned one holds (in a network namespace with a sandbox root), the HTML
report renders every plot in headless Chromium, and compare lines files up."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, proxytune
from proxytune.microbench import proxybench

HAVE = IS_ROOT and shutil.which("wrk") and Path("/usr/sbin/squid").exists() and Path("/usr/sbin/nginx").exists()
needs_servers = pytest.mark.skipif(not HAVE, reason="needs root, squid, nginx and wrk")
RESULTS = REPO / "docs" / "results"


def test_lua_script_has_every_placeholder_filled(tmp_path):
    text = proxybench.lua_script(tmp_path, 8080, 123, "s1-").read_text()
    code = "\n".join(l for l in text.splitlines() if not l.startswith("--"))
    for word in ("ORIGIN", "FILES", "REPEAT", "HISTORY", "RUN"):
        assert word not in code
    assert '"http://127.0.0.1:8080/o/s1-"' in code and "math.random(123)" in code


def test_access_log_counts_hits_and_errors():
    log = "\n".join([
        "1.0 1 127.0.0.1 TCP_HIT/200 1000 GET http://o/o/1/2 - HIER_NONE/- text/plain",
        "1.0 0 127.0.0.1 TCP_MEM_HIT/200 500 GET http://o/o/1/3 - HIER_NONE/- text/plain",
        "1.0 5 127.0.0.1 TCP_MISS/200 3000 GET http://o/o/1/4 - HIER_DIRECT/127.0.0.1 text/plain",
        "1.0 9 127.0.0.1 TCP_MISS/503 0 GET http://o/o/1/5 - HIER_NONE/- -",
        "1.0 5 127.0.0.1 TCP_MISS/200 3000 GET http://o/o/idle-1/1 - HIER_DIRECT/127.0.0.1 text/plain"])
    r = proxybench.access_log(log)
    assert r["requests"] == 4 and r["hit_ratio"] == 0.5
    assert r["byte_hit_ratio"] == pytest.approx(1500 / 4500)
    assert r["errors"] == {"TCP_MISS/503": 1}
    assert r["service_ms"] == {"n": 4, "p50": 5.0, "p90": 9.0, "p99": 9.0, "max": 9.0, "mean": 3.75}   # its elapsed, ms


@needs_servers
def test_every_store_serves_the_mix_and_hits(monkeypatch):
    monkeypatch.setitem(proxybench.QUICK, "fill_s", 4)
    monkeypatch.setitem(proxybench.QUICK, "steady_s", 5)
    monkeypatch.setitem(proxybench.QUICK, "files", 800)
    ours = lambda: set(Path("/tmp").glob("proxytune-squid-*")) | set(Path("/tmp").glob("proxytune-proxybench-*"))
    before = ours()                 # a run killed earlier may have left its own: not this run's to judge
    r = proxybench.run(quick=True, stores=["ufs", "aufs", "rock"], concurrency=20, idle=50, quiet=True)
    assert [s["store"] for s in r["stores"]] == ["ufs", "aufs", "rock"]
    for s in r["stores"]:
        assert s["steady"]["rps"] > 100, s["store"]
        assert s["error_count"] == 0, (s["store"], s["errors"])
        # hits happen and stay below the offered 0.55 repeat rate; ufs and aufs store fewer objects once
        # busy or full (seen 0.04-0.19; BENCHMARKS explains), so the floor only says hits are served at all
        assert 0.02 < s["hit_ratio"] < 0.9, (s["store"], s["hit_ratio"])
        # Squid's access log and its X-Cache headers seen by wrk agree on the hit ratio
        xc = s["steady"]["x_cache_hits"] / (s["steady"]["x_cache_hits"] + s["steady"]["x_cache_misses"])
        assert abs(xc - s["hit_ratio"]) < 0.1, (s["store"], xc, s["hit_ratio"])
        assert s["latency_probe"]["hit"]["n"] > 0 and s["latency_probe"]["miss"]["n"] > 0
    assert not ours() - before


@needs_servers
def test_compare_profile_a_1024_fd_squid_fails_where_the_tuned_one_holds(tmp_path):
    """In a network namespace (net.* sysctls private) with a sandbox root (the service drop-in)."""
    root, state = tmp_path / "root", tmp_path / "state"
    (root / "etc").mkdir(parents=True)
    env = {**os.environ, "PROXYTUNE_ROOT": str(root), "PROXYTUNE_STATE_DIR": str(state)}
    script = (f"ip link set lo up; before=$(sysctl -n net.core.somaxconn); "
              f"{REPO}/.venv/bin/python {REPO}/cli.py bench proxy --quick --compare-profile linux/squid "
              f"--only 'sysctl:net.*' --only 'service:*' --yes --json -o {tmp_path}/r.json > /dev/null; "
              f"echo somaxconn $before $(sysctl -n net.core.somaxconn)")
    p = subprocess.run(["unshare", "-n", "bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((tmp_path / "r.json").read_text())["data"]
    before, after = r["before"], r["after"]
    assert before["nofile"][0] == 1024 and after["nofile"][0] > 4096
    brief = json.dumps([{k: d.get(k) for k in ("nofile", "fd", "error_count", "errors", "steady")}
                        for d in (before, after)])
    # At 1024 Squid runs into its own descriptor zones and never with the profile's limit. Which zone varies
    # by host: below 100 free it defers accepts and says so in cache.log (once per 15 s); below 200 free it
    # silently refuses keep-alive, which drops idle clients (a CI host: 210 dropped, no cache.log line).
    assert before["fd"]["pressure"] in ("accepts deferred", "keep-alive refused"), brief
    assert after["fd"]["pressure"] == "none" and after["errors"]["fd_warnings_in_cache_log"] == 0, brief
    # How that shows to clients varies: deferred accepts mostly cost time (half the req/s, p99.9 3 s seen),
    # refused keep-alive drops idle clients: one of the two, clearly. Counted are the failures a descriptor
    # limit causes (connections refused, reset or dropped); wrk's timeouts are not among them: they are the
    # latency tail of squid's one event loop on a saturated 2-core host, and the tuned squid, holding every
    # idle client and every wrk connection at once, has the longer tail (82 timeouts, p99 3.6 s, seen in CI
    # with 0 dropped against 184).
    fd_failed = [_fd_failures(d) for d in (before, after)]
    assert fd_failed[1] <= fd_failed[0], brief
    assert (fd_failed[0] > 10 * max(fd_failed[1], 1)
            or before["steady"]["rps"] < 0.8 * after["steady"]["rps"]), brief
    assert after["steady"]["rps"] > 0
    assert r["rolled_back"] and r["applied"]
    somaxconn = p.stdout.split("somaxconn")[1].split()
    assert somaxconn[0] == somaxconn[1]                       # restored in the namespace
    assert not list((root / "etc").rglob("*proxytune*"))      # the drop-in is gone


def _fd_failures(d: dict) -> int:
    """Client failures a descriptor limit causes: wrk's connections refused, reset or cut mid-write, idle
    clients refused or dropped (microbench/proxybench.py _error_count, without wrk's timeouts)."""
    sock = d["errors"]["wrk_socket"]
    return (sock["connect"] + sock["read"] + sock["write"] + sum(d["errors"]["idle_clients_failed"].values())
            + max(d["errors"]["idle_clients_dropped"], 0))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not CHROMIUM, reason="needs chromium (Debian: chromium)")
def test_report_html_renders_every_plot_in_headless_chromium(tmp_path):
    out = tmp_path / "report"
    p = proxytune("report", "-o", str(out), "--from", str(RESULTS / "events-full.json"),
                  "--from", str(RESULTS / "fdscan-full.json"), "--from", str(RESULTS / "storage-full.json"))
    assert p.returncode == 0, p.stderr
    html = (out / "report.html").read_text()
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<script" not in html   # nothing fetched
    n_img = html.count("<img ")
    assert n_img >= 6
    # a copy with one line of script that counts the images the browser decoded
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", "<script>document.body.setAttribute('data-rendered', "
                                             "[...document.images].filter(i => i.complete && i.naturalWidth > 100)"
                                             ".length + '/' + document.images.length)</script></body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert f'data-rendered="{n_img}/{n_img}"' in dom.stdout, dom.stdout[-500:] + dom.stderr[-500:]
    # phone and desktop widths: nothing wider than the window; on a phone the tables turn into cards
    fit = tmp_path / "fit.html"
    fit.write_text(html.replace("</body>", "<script>const d = document.documentElement; document.body.setAttribute("
                                          "'data-fit', (d.scrollWidth <= innerWidth) + '/' + getComputedStyle("
                                          "document.querySelector('table.cards tr')).display)</script></body>"))
    for width, header_row in ((390, "none"), (1280, "table-row")):
        dom = subprocess.run([CHROMIUM, *flags, f"--window-size={width},900", "--dump-dom", fit.as_uri()],
                             capture_output=True, text=True, timeout=120)
        assert f'data-fit="true/{header_row}"' in dom.stdout, (width, dom.stdout[-300:], dom.stderr[-300:])
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1200,3000", (out / "report.html").as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 50_000      # a page with plots, not a blank one


def test_report_compare_puts_files_side_by_side(tmp_path):
    p = proxytune("report", "compare", str(RESULTS / "events-full.json"), str(RESULTS / "storage-full.json"),
                  "-o", str(tmp_path))
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "compare.md").read_text()
    assert "| poll, N=100 | 6,175 ns | - |" in md
    assert "ext4 largefile sync: fill obj/s" in md
    bad = proxytune("report", "compare", str(RESULTS / "events-full.json"), str(REPO / "README.md"))
    assert bad.returncode == 2 and "README.md: cannot read it" in bad.stderr


@needs_servers
def test_target_loads_a_proxy_we_did_not_start(monkeypatch):
    """--target: a squid started outside the bench is loaded; hits come from its X-Cache headers."""
    from proxytune.microbench import servers
    monkeypatch.setitem(proxybench.QUICK, "fill_s", 3)
    monkeypatch.setitem(proxybench.QUICK, "steady_s", 4)
    monkeypatch.setitem(proxybench.QUICK, "files", 500)
    with servers.Squid("rock", cache_mb=200, mem_mb=8) as sq:
        r = proxybench.run(quick=True, concurrency=20, idle=20, quiet=True, target=f"127.0.0.1:{sq.port}")
        assert sq.proc.poll() is None                     # still running: the bench did not stop it
    [s] = r["stores"]
    assert r["target"] == f"127.0.0.1:{sq.port}" and s["nofile"] is None
    assert s["steady"]["rps"] > 100 and s["error_count"] == 0
    assert 0.2 < s["hit_ratio"] < 0.9


@pytest.mark.parametrize("target", ["nohostport", "host:0", "host:99999", "a b:80"])
def test_target_must_be_host_and_port(target):
    p = proxytune("bench", "proxy", "--target", target)
    assert p.returncode == 2 and "--target must be HOST:PORT" in p.stderr


def test_squid_fd_pressure_follows_squids_own_zones():
    from proxytune.microbench.proxybench import squid_fd_pressure
    # RESERVED_FD = min(100, limit / 4): deferred below it, no keep-alive below twice it or a quarter in use
    assert squid_fd_pressure(1024, 925) == "accepts deferred"
    assert squid_fd_pressure(1024, 924) == squid_fd_pressure(1024, 820) == "keep-alive refused"
    assert squid_fd_pressure(1024, 819) == squid_fd_pressure(20000, 900) == "none"
    assert squid_fd_pressure(256, 150) == "keep-alive refused" and squid_fd_pressure(256, 193) == "accepts deferred"
    assert squid_fd_pressure(4000, 3300) == "keep-alive refused"          # fewer free than a quarter in use
