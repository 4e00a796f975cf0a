"""Hostile result files and failing benches: `report --from` a FIFO, /dev/zero or deeply nested
JSON is one clear line (bounded, never a hang), a saved result's hostile strings render inert in
Markdown and HTML, and `bench --json` with a read-only cache or a failing compiler stays valid JSON
with exit 2 (from the second review; the operator's prompt: test_adversarial_prompt.py)."""

import json
import os
import resource
import subprocess

from conftest import needs_root, proxytune
from test_adversarial_prompt import PY


# -- bench JSON -----------------------------------------------------------------------------

@needs_root
def test_bench_with_a_read_only_cache_dir_is_one_clear_line(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                        f"mount --bind {cache} {cache} && mount -o remount,bind,ro {cache} && "
                        f"PROXYTUNE_CACHE_DIR={cache} {' '.join(PY)} bench fdscan --quick --json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: ")
    json.loads(r.stdout)


def test_bench_with_a_failing_compiler_is_valid_json_and_exit_2(tmp_path):
    cache = tmp_path / "cache"
    r = proxytune("bench", "fdscan", "--quick", "--json", env={"CC": "/bin/false", "PROXYTUNE_CACHE_DIR": str(cache)})
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: bench fdscan: building fdscan failed")
    assert json.loads(r.stdout)["data"]["available"] is False


# -- report --from hostile files ------------------------------------------------------------

def _report_from(path, tmp_path, limit_as=None, timeout=60):
    def limit():
        if limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    try:
        return subprocess.run([*PY, "report", "--no-bench", "--from", str(path), "-o", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=timeout, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return None


def test_report_from_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    r = _report_from(fifo, tmp_path, timeout=30)
    assert r is not None and r.returncode == 2 and "not a regular file" in r.stderr


def test_report_from_dev_zero_is_bounded(tmp_path):
    link = tmp_path / "r.json"
    link.symlink_to("/dev/zero")
    r = _report_from(link, tmp_path, limit_as=2 << 30)      # bounded: never let it eat the machine
    assert r is not None and r.returncode == 2 and "internal error" not in r.stderr


def test_report_from_deeply_nested_json_is_one_clear_line(tmp_path):
    deep = tmp_path / "r.json"
    deep.write_text("[" * 100000)
    r = _report_from(deep, tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("proxytune: error: ")


EVIL = "<script>alert(1)</script> | a | b\n| x |\n```"


def _evil_fdscan(tmp_path):
    """A saved fdscan result (a real one's shape) whose strings are hostile."""
    doc = {"schema": "proxytune.result/1", "kind": "bench", "created": "2026-11-23T12:00:00Z",
           "host": {"hostname": EVIL, "os": EVIL, "kernel": "6", "arch": "x86_64", "cpu_model": EVIL,
                    "cores": 2, "memory_kib": 1, "virtualised": "no", "filesystems": []},
           "data": {"bench": "fdscan", "quick": True, "variants": {str(i): EVIL for i in range(1, 6)},
                    "points": [{"variant": v, "n": n, "handlers_per_call": 9.0, "command": EVIL,
                                "ns_per_call": {"median": 100.0 * v, "min": 90.0 * v, "max": 110.0 * v, "n": 5,
                                                "iqr_rel": 0.1, "ci95": [90.0 * v, 110.0 * v]}}
                               for v in range(1, 6) for n in (100, 1000)],
                    "misses": [], "miss_source": "unavailable", "miss_source_note": EVIL}}
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(doc))
    return path


def _render_evil(tmp_path):
    r = _report_from(_evil_fdscan(tmp_path), tmp_path, timeout=120)
    assert r.returncode in (0, 1), r.stderr          # a schema change that refuses the file must update it
    return tmp_path / "out"


def test_report_html_has_no_live_script_from_a_saved_result(tmp_path):
    out = _render_evil(tmp_path)
    html = (out / "report.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html


def test_report_md_tables_survive_newlines_in_strings(tmp_path):
    out = _render_evil(tmp_path)
    md = (out / "report.md").read_text().splitlines()
    start = next(i for i, line in enumerate(md) if line.startswith("| variant |"))
    width = md[start].count(" | ")
    rows = []
    for line in md[start + 2:]:
        if not line.strip():
            break
        rows.append(line)
    assert rows and all(line.startswith("| ") and line.replace("\\|", "").count(" | ") == width for line in rows)
