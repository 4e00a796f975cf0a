"""The playbook `proxytune fleet` hands to ansible-playbook, and the bundle
it ships: the packaged files of this checkout or installation as a tarball,
carried in the one task of each run to fleet_unpack.py (the play's Ansible
module), which verifies it on each host, unpacks it under the root-only state
dir (or reuses a verified unpack of the same digest), runs proxytune there
with become and cleans up.

The playbook is written as JSON (valid YAML), so no host name, profile name
or path is ever spliced into YAML or a shell: commands are argv lists.
"""

import base64
import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path, PurePosixPath

from .datafiles import PACKAGE_ROOT, data_root

# what the wheel and the .deb carry besides the Python code (pyproject package-data)
DATA = ("profiles/*/*.toml", "probes/*.bt", "probes/*.c", "microbench/*/*.c", "microbench/*/*.h",
        "microbench/lua/*.lua", "reports/schemas/*.json")


def code_tops(tree: Path = PACKAGE_ROOT) -> tuple[str, ...]:
    """The entries of the tree a bundle ships: cli.py, every top-level package (a directory with
    an __init__.py, so a new layer is shipped without anyone editing this file; a test holds the
    set to pyproject's packages) and the directories of the shipped data."""
    packages = {d.name for d in (tree.iterdir() if tree.is_dir() else ())
                if not d.is_symlink() and d.is_dir() and (d / "__init__.py").is_file()}
    return tuple(sorted({"cli.py", *packages, *(glob.split("/")[0] for glob in DATA)}))


UNPACKER = Path(__file__).resolve().parent / "fleet_unpack.py"
PROFILE_IN_BUNDLE = "fleet-profile.toml"
RUN_TASK, ROLLBACK_TASK, MARK_TASK = "proxytune run", "proxytune rollback", "proxytune journal mark"
DEPENDENCY_TASK = "proxytune dependencies"
RESULT_TASKS = (RUN_TASK, ROLLBACK_TASK)


def _packaged(rel: PurePosixPath) -> bool:
    """Python code and the data files the packages ship; nothing else (no notes, no build output)."""
    if "__pycache__" in rel.parts:
        return False
    return rel.suffix == ".py" or any(rel.match(pattern) and len(rel.parts) == pattern.count("/") + 1
                                      for pattern in DATA)


def _tracked(tree: Path) -> set[str] | None:
    """The files git tracks when `tree` is a checkout (untracked junk stays home); None elsewhere.
    core.fsmonitor is off so that no hook of the checkout runs."""
    if not (tree / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(tree), "ls-files", "-z"],
                           capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):       # no git here: the packaged-files rule alone
        return None
    return set(os.fsdecode(n) for n in r.stdout.split(b"\0") if n) if r.returncode == 0 else None


def _files_under(tree: Path):
    """(path, relative path) of every regular file below tree's code_tops, never through a symlink."""
    for top in code_tops(tree):
        base = tree / top
        if base.is_symlink():
            continue
        if base.is_file():
            yield base, PurePosixPath(top)
            continue
        for here, dirs, names in os.walk(base):          # followlinks=False: linked dirs are left out
            dirs[:] = sorted(d for d in dirs if not (Path(here) / d).is_symlink())
            for name in sorted(names):
                f = Path(here) / name
                if stat.S_ISREG(os.lstat(f).st_mode):
                    yield f, PurePosixPath(f.relative_to(tree).as_posix())


def shipped_files(code: Path = PACKAGE_ROOT, data: Path | None = None) -> list[tuple[Path, PurePosixPath]]:
    """What a bundle carries: the code tree and (for the .deb, apart) the data tree; in a checkout,
    only what git tracks."""
    found: dict[PurePosixPath, Path] = {}
    for tree in dict.fromkeys((code, data or data_root())):
        tracked = _tracked(tree)
        for f, rel in _files_under(tree):
            if _packaged(rel) and (tracked is None or str(rel) in tracked):
                found.setdefault(rel, f)
    return sorted(((f, rel) for rel, f in found.items()), key=lambda pair: str(pair[1]))


def _read(f: Path) -> bytes:
    fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def bundle(dest: Path, profile_file: Path | None = None, code: Path = PACKAGE_ROOT,
           data: Path | None = None) -> tuple[Path, str]:
    """A reproducible tar.gz of the project (same content, same bytes, same
    sha256, which each host verifies before it unpacks)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members = [(f, str(rel)) for f, rel in shipped_files(code, data)]
        if profile_file:
            members.append((profile_file, PROFILE_IN_BUNDLE))
        for f, rel in members:
            info = tarfile.TarInfo(rel)
            payload = _read(f)
            info.size, info.mode, info.mtime = len(payload), 0o755 if f.stat().st_mode & 0o100 else 0o644, 0
            tar.addfile(info, io.BytesIO(payload))
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    sha = hashlib.sha256(packed.getvalue()).hexdigest()
    out = dest / f"proxytune-{sha[:16]}.tar.gz"
    out.write_bytes(packed.getvalue())
    return out, sha


STATE_DIR = "{{ proxytune_state_dir | default('/var/lib/proxytune') }}"
MODULE = "proxytune_fleet"          # UNPACKER, as the play's Ansible module (library/ beside the playbook)


def remote_dir(bundle_id: str) -> str:
    """Per host and run: under its state dir (root-only), a directory no earlier run used."""
    return STATE_DIR + "/fleet/bundle-" + bundle_id


ENV = {"PROXYTUNE_ROOT": "{{ proxytune_root | default('/') }}", "PROXYTUNE_STATE_DIR": STATE_DIR}
PYTHON = "{{ proxytune_python | default('/usr/bin/python3') }}"
PAYLOAD = "{{ proxytune_bundle }}"     # a play variable: the tarball, base64, once in the playbook


def run_task(argv: list[str], bundle_id: str, sha: str, ok_codes: tuple[int, ...], timeout: int,
             name: str = RUN_TASK) -> dict:
    """One task, one ssh exchange: the module verifies the shipped tarball against its digest,
    unpacks it (or reuses a verified unpack), runs cli.py with argv there, stopped after
    `timeout` seconds, and cleans up; an exit code outside ok_codes fails the host."""
    return {"name": name, "environment": ENV, "register": "proxytune_out",
            MODULE: {"state_dir": STATE_DIR, "bundle": bundle_id, "sha256": sha, "payload": PAYLOAD,
                     "python": PYTHON, "argv": list(argv), "timeout": timeout, "ok": list(ok_codes),
                     "deps": "install"}}


def with_dependencies(first: dict, install: bool) -> list[dict]:
    """The play's first run and, only on a host where it found proxytune's Python modules
    missing (the module says `skipped`, naming their Debian packages): apt installs them, then
    the same run again, which says in one line what is still missing. --no-install: the first
    run says so itself."""
    if not install:
        return [_with_deps(first, "no-install")]
    missing = "proxytune_out.missing is defined"
    return [first,
            {"name": DEPENDENCY_TASK, "when": missing,
             "ansible.builtin.apt": {"name": "{{ proxytune_out.missing }}", "state": "present"}},
            {**_with_deps(first, "after-apt"), "when": missing}]


def _with_deps(task: dict, deps: str) -> dict:
    return {**task, MODULE: {**task[MODULE], "deps": deps}}


def playbook(tasks: list[dict], tarball: Path, timeout: int, serial: int | None = None,
             stop_on_failure: bool = False) -> str:
    """Every task bounded by `timeout` seconds (a hung ssh or module fails that host only).
    Hosts go through the play each at its own pace (strategy free) unless a failure must stop
    the others (a rollout: linear, any_errors_fatal, which free does not support)."""
    body = [{**t, "timeout": t.get("timeout", timeout + 30)} for t in tasks]
    play = {"name": "proxytune fleet", "hosts": "all", "become": True, "gather_facts": False,
            "vars": {"proxytune_bundle": base64.b64encode(tarball.read_bytes()).decode()}, "tasks": body}
    if serial:
        play["serial"] = serial
    if stop_on_failure:
        play["any_errors_fatal"] = True
    else:
        play["strategy"] = "free"
    return json.dumps([play], indent=1) + "\n"


def library(workdir: Path) -> Path:
    """The module beside the playbook (Ansible looks for modules in library/ next to it)."""
    lib = workdir / "library"
    lib.mkdir(mode=0o700, exist_ok=True)
    (lib / f"{MODULE}.py").write_bytes(UNPACKER.read_bytes())
    return lib


def profile_arg(profile_ref: str, shipped: bool, bundle_id: str) -> str:
    """The --profile the host sees: a shipped name as is, a file as its bundled copy."""
    return remote_dir(bundle_id) + "/" + PROFILE_IN_BUNDLE if shipped else profile_ref
