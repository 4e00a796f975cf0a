"""The playbook `proxytune fleet` hands to ansible-playbook, and the bundle
it ships: this project as a tarball, unpacked once per version under a
root-only directory on each host, then run there with become.

The playbook is written as JSON (valid YAML), so no host name, profile name
or path is ever spliced into YAML or a shell: commands are argv lists.
"""

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("cli.py", "core", "tune", "reports", "profiles", "probes", "microbench")
SKIP_PARTS = ("__pycache__", ".build", "build")
PROFILE_IN_BUNDLE = "fleet-profile.toml"
RUN_TASK, ROLLBACK_TASK = "proxytune run", "proxytune rollback"
RESULT_TASKS = (RUN_TASK, ROLLBACK_TASK)


def _shipped_files(repo: Path):
    for top in SHIPPED:
        p = repo / top
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            rel = f.relative_to(repo)
            if not any(part in SKIP_PARTS for part in rel.parts) and f.suffix not in (".pyc", ".o"):
                yield f, rel


def bundle(dest: Path, profile_file: Path | None = None, repo: Path = REPO) -> tuple[Path, str]:
    """A reproducible tar.gz of the project (same content, same bytes, same
    hash), so hosts that already have this version skip the unpack."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members = list(_shipped_files(repo))
        if profile_file:
            members.append((profile_file, Path(PROFILE_IN_BUNDLE)))
        for f, rel in members:
            info = tarfile.TarInfo(str(rel))
            data = f.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o755 if f.stat().st_mode & 0o100 else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256(raw.getvalue()).hexdigest()[:16]
    out = dest / f"proxytune-{digest}.tar.gz"
    with open(out, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out, digest


def remote_dir(digest: str) -> str:
    """Per host: under its state dir (root-only), one directory per version."""
    return "{{ proxytune_state_dir | default('/var/lib/proxytune') }}/fleet/bundle-" + digest


ENV = {"PROXYTUNE_ROOT": "{{ proxytune_root | default('/') }}",
       "PROXYTUNE_STATE_DIR": "{{ proxytune_state_dir | default('/var/lib/proxytune') }}"}
PYTHON = "{{ proxytune_python | default('/usr/bin/python3') }}"


def ship_tasks(tarball: Path, digest: str) -> list[dict]:
    where = remote_dir(digest)
    return [
        {"name": "proxytune bundle directory",
         "ansible.builtin.file": {"path": where, "state": "directory", "mode": "0700"}},
        {"name": "ship proxytune",
         "ansible.builtin.copy": {"src": str(tarball), "dest": where + "/proxytune.tar.gz", "mode": "0600"}},
        {"name": "unpack proxytune",
         "ansible.builtin.command": {"argv": ["tar", "-xzf", where + "/proxytune.tar.gz", "-C", where],
                                     "creates": where + "/cli.py"}},
    ]


def run_task(argv: list[str], digest: str, ok_codes: tuple[int, ...], name: str = RUN_TASK) -> dict:
    """Run cli.py on the host; rc outside ok_codes fails the host."""
    return {"name": name,
            "ansible.builtin.command": {"argv": [PYTHON, remote_dir(digest) + "/cli.py", *argv]},
            "environment": ENV, "register": "proxytune_out", "changed_when": False,
            "failed_when": f"proxytune_out.rc not in {list(ok_codes)}"}


def playbook(tasks: list[dict], serial: int | None = None, stop_on_failure: bool = False) -> str:
    play = {"name": "proxytune fleet", "hosts": "all", "become": True, "gather_facts": False,
            "tasks": tasks}
    if serial:
        play["serial"] = serial
    if stop_on_failure:
        play["any_errors_fatal"] = True
    return json.dumps([play], indent=1) + "\n"


def profile_arg(profile_ref: str, shipped: bool, digest: str) -> str:
    """The --profile the host sees: a shipped name as is, a file as its bundled copy."""
    return remote_dir(digest) + "/" + PROFILE_IN_BUNDLE if shipped else profile_ref
