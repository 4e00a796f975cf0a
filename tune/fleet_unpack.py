#!/usr/bin/python
"""Runs on each fleet host: the standard library only (the host may lack
click, rich and jsonschema yet). One file, two roles:

1. The Ansible module of `proxytune fleet`'s play (a JSONARGS module: Ansible
   writes the task's arguments into ARGS below and, with pipelining, pipes
   this file to the host's python over the ssh connection it already has, so
   one task is one ssh exchange). It vets the state directory (ours, nobody
   else can write it or any parent), verifies the shipped tarball against the
   digest the controller computed, and unpacks it into a fresh private
   directory renamed into place as fleet/code-SHA256, or reuses that
   directory, which a run of the same bundle made, once it is checked: a real
   directory of ours, mode 0700, holding exactly the tarball's files, byte
   for byte, and Python's own __pycache__. Nothing already on the host is
   trusted because it exists: what does not match is never run. A shipped
   profile goes into fleet/bundle-BUNDLE_ID, a name no earlier run used. Then
   it runs proxytune from there with `timeout`, removes this run's directory
   and code nobody used for a day, and answers rc, stdout and stderr.
2. `python3 fleet_unpack.py --run DEPS CLI_PY ARGS...`, which 1 starts with
   the host's proxytune_python: exit 3 when Python modules proxytune needs are
   missing (DEPS "install": their Debian packages on stdout, for the play's
   apt task; "no-install" or "after-apt": one line on stderr), else cli.py
   runs in this process.

BUNDLE_ID is the tarball digest's first 16 hex digits plus a per-run token.
"""

import sys

if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]         # neither the cwd (a piped module) nor tune/ (its profile.py is a stdlib name)

import base64  # noqa: E402
import binascii  # noqa: E402
import contextlib  # noqa: E402
import fcntl  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import runpy  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

# The task's arguments as JSON, written in by Ansible. Any JSON fits a raw triple-quoted string:
# a quote inside a JSON string is escaped (\"), which does not end a raw string, and three
# unescaped quotes in a row are not JSON.
ARGS = r"""<<INCLUDE_ANSIBLE_MODULE_JSON_ARGS>>"""

BUNDLE_ID = re.compile(r"[0-9a-f]{16}-[0-9a-f]{12}")
SHA256 = re.compile(r"[0-9a-f]{64}")
MEMBER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")
PYC = re.compile(r"[A-Za-z0-9_.+-]+\.pyc(\.[0-9]+)?")        # Python writes NAME.pyc through NAME.pyc.ID
PROFILE = "fleet-profile.toml"                                 # fleet_play.PROFILE_IN_BUNDLE
NEEDS = {"click": "python3-click", "rich": "python3-rich", "jsonschema": "python3-jsonschema"}
DEPS = ("install", "no-install", "after-apt")
STALE_SECONDS = 24 * 3600


class Refused(Exception):
    pass


def vet_path(path: str) -> None:
    """Every directory from / down to path: a real directory owned by root or
    us, writable by nobody else (a sticky root-owned /tmp is fine for parents)."""
    me = os.geteuid()
    where = "/"
    parts = [p for p in os.path.abspath(path).split("/") if p]
    for i, part in enumerate([""] + parts):
        where = os.path.join(where, part) if part else "/"
        st = os.lstat(where)
        last = i == len(parts)
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(f"{where} is not a directory (a symlink?)")
        if st.st_uid not in (0, me):
            raise Refused(f"{where} is owned by uid {st.st_uid}, not root")
        sticky = st.st_mode & stat.S_ISVTX and st.st_uid == 0 and not last
        if st.st_mode & 0o022 and not sticky:
            raise Refused(f"{where} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})")


def private_dir(path: str) -> None:
    """path exists as a directory of ours, mode 0700 (made so if absent)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise Refused(f"{path} must be a directory owned by root, mode 0700 "
                      f"(it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")


def fleet_dir(state_dir: str) -> str:
    """STATE_DIR (made 0700 if absent, as proxytune's journal keeps it) and its fleet/, both vetted."""
    vet_path(os.path.dirname(os.path.abspath(state_dir)))
    if not os.path.lexists(state_dir):
        os.mkdir(state_dir, 0o700)
    vet_path(state_dir)
    os.chmod(state_dir, 0o700, follow_symlinks=False)
    fleet = os.path.join(state_dir, "fleet")
    private_dir(fleet)
    return fleet


def verify(payload: bytes, sha: str) -> None:
    if hashlib.sha256(payload).hexdigest() != sha:
        raise Refused(f"the shipped bundle does not match its digest {sha[:16]}")


def checked_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Regular files and directories with plain relative names; anything else refuses the bundle."""
    members = tar.getmembers()
    for m in members:
        if not (m.isreg() or m.isdir()) or not MEMBER.fullmatch(m.name) or ".." in m.name.split("/"):
            raise Refused(f"the bundle holds {m.name!r}, which is not a plain file")
        m.mode &= 0o755
    return members


def files_of(payload: bytes) -> dict[str, tuple[int, bytes]]:
    """name -> (mode, content) of every regular file in the verified tarball."""
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
        return {m.name: (m.mode, tar.extractfile(m).read()) for m in checked_members(tar) if m.isreg()}


def write_tree(root: str, files: dict[str, tuple[int, bytes]]) -> None:
    for name, (mode, data) in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def matches(root: str, files: dict[str, tuple[int, bytes]]) -> bool:
    """root holds exactly `files` (and __pycache__/*.pyc), every entry a real file or directory of
    ours that nobody else can write, no link anywhere."""
    me = os.geteuid()
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or stat.S_IMODE(st.st_mode) != 0o700:
        return False
    parents = {os.path.dirname(n) for n in files}
    parents |= {p for n in parents for p in _ancestors(n)}
    seen = set()
    for here, dirs, names in os.walk(root):
        rel = os.path.relpath(here, root)
        rel = "" if rel == "." else rel
        for name in dirs + names:
            path, sub = os.path.join(here, name), os.path.join(rel, name)
            st = os.lstat(path)
            if st.st_uid != me or st.st_mode & 0o022:
                return False
            if stat.S_ISDIR(st.st_mode):
                if sub not in parents and name != "__pycache__":
                    return False
            elif not stat.S_ISREG(st.st_mode):
                return False
            elif sub in files:
                if _read(path) != files[sub][1]:
                    return False
                seen.add(sub)
            elif os.path.basename(here) != "__pycache__" or not PYC.fullmatch(name):
                return False
    return len(seen) == len(files)


def _ancestors(rel: str):
    while rel:
        yield rel
        rel = os.path.dirname(rel)


@contextlib.contextmanager
def code_dir(fleet: str, sha: str, files: dict):
    """The verified unpack of this bundle, held (a shared lock) while proxytune runs from it:
    fleet/code-SHA reused when it matches, else made anew. One that does not match and that
    no run holds is replaced; one that a run holds is left alone and this run unpacks privately."""
    shared = os.path.join(fleet, f"code-{sha}")
    fd = _open_dir(shared)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if matches(shared, files):
            os.utime(shared)                   # in use: not stale
            try:
                yield shared
            finally:
                os.close(fd)
            return
        os.close(fd)
    if os.path.lexists(shared):              # no match, or not a directory at all
        _discard(fleet, shared)
    fresh = tempfile.mkdtemp(prefix=".unpack-", dir=fleet)
    try:
        write_tree(fresh, files)
        if not os.path.lexists(shared):
            with contextlib.suppress(OSError):     # another run's rename came first: ours stays private
                os.rename(fresh, shared)
                fresh = shared
        fd = _open_dir(fresh)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            yield fresh
        finally:
            os.close(fd)
    finally:
        if fresh != shared:
            shutil.rmtree(fresh, ignore_errors=True)


def _open_dir(path: str):
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:             # ELOOP: a symlink where the directory goes
        return None


def _discard(fleet: str, path: str) -> bool:
    """Move path aside and remove it, unless a run holds it (then it stays, and is never used)."""
    fd = _open_dir(path)
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
    aside = os.path.join(fleet, f".stale-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(path, aside)
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
    shutil.rmtree(aside, ignore_errors=True)
    if os.path.lexists(aside):          # rmtree cannot remove a file: it goes as it is
        os.unlink(aside)
    return True


@contextlib.contextmanager
def run_dir(fleet: str, bundle_id: str, files: dict):
    """fleet/bundle-BUNDLE_ID with this run's shipped profile (none: no directory); the name
    must be new, and the directory goes when the run ends."""
    if PROFILE not in files:
        yield None
        return
    mine = os.path.join(fleet, f"bundle-{bundle_id}")
    try:
        os.mkdir(mine, 0o700)
    except FileExistsError:
        raise Refused(f"{mine} exists already: this run's bundle name was taken") from None
    try:
        write_tree(mine, {PROFILE: files[PROFILE]})
        yield mine
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def remove_stale(fleet: str) -> None:
    """Code nobody used for a day, and what killed runs left."""
    now = time.time()
    for name in os.listdir(fleet):
        path = os.path.join(fleet, name)
        if not name.startswith(("code-", "bundle-", ".unpack-", ".stale-")):
            continue
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and now - st.st_mtime > STALE_SECONDS:
            _discard(fleet, path)


def missing_packages() -> list[str]:
    return [pkg for mod, pkg in NEEDS.items() if importlib.util.find_spec(mod) is None]


def checked_args(args) -> dict:
    """The module's arguments, every one of the type and shape it must have."""
    shapes = {"state_dir": str, "bundle": str, "sha256": str, "payload": str, "python": str, "argv": list,
              "timeout": int, "ok": list, "deps": str}
    if not isinstance(args, dict) or any(not isinstance(args.get(k), t) for k, t in shapes.items()):
        raise Refused("the module's arguments are incomplete")
    if not SHA256.fullmatch(args["sha256"]) or not BUNDLE_ID.fullmatch(args["bundle"]) \
            or not args["bundle"].startswith(args["sha256"][:16]) or args["deps"] not in DEPS:
        raise Refused("the module's bundle id, digest or deps argument is malformed")
    for key in ("state_dir", "python"):
        if not os.path.isabs(args[key]) or any(c in args[key] for c in "\0\n"):
            raise Refused(f"{key} must be an absolute path")
    if not all(isinstance(a, str) and "\0" not in a for a in args["argv"]) \
            or not all(type(c) is int for c in args["ok"]) or args["timeout"] < 1:
        raise Refused("the module's argv, ok or timeout argument is malformed")
    return args


def launch(args: dict, code: str) -> subprocess.CompletedProcess:
    """proxytune itself, under the host's proxytune_python, stopped after the timeout
    (SIGTERM, SIGKILL 15 s later; exit 124), so a hung run does not outlive the play."""
    argv = ["timeout", "-k", "15", str(args["timeout"]), args["python"], os.path.join(code, "tune", "fleet_unpack.py"),
            "--run", args["deps"], os.path.join(code, "cli.py"), *args["argv"]]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)


def serve(args) -> dict:
    """The module's work, as the result Ansible reads (rc, stdout, stderr; failed or skipped)."""
    try:
        a = checked_args(args)
        try:
            payload = base64.b64decode(a["payload"], validate=True)
        except (binascii.Error, ValueError):
            raise Refused("the shipped bundle is not base64") from None
        verify(payload, a["sha256"])
        fleet = fleet_dir(a["state_dir"])
        files = files_of(payload)
        with code_dir(fleet, a["sha256"], files) as code, run_dir(fleet, a["bundle"], files):
            r = launch(a, code)
        remove_stale(fleet)
    except (Refused, OSError, tarfile.TarError) as e:
        line = f"proxytune bundle refused: {e}"
        return {"failed": True, "changed": False, "rc": 2, "msg": line, "stderr": line, "stdout": ""}
    out = {"changed": False, "rc": r.returncode, "stdout": r.stdout.decode(errors="replace"),
           "stderr": r.stderr.decode(errors="replace")}
    if r.returncode == 3 and a["deps"] == "install" and out["stdout"].split():
        return {**out, "skipped": True, "failed": False, "missing": out["stdout"].split(),
                "msg": f"Python modules missing: apt installs {out['stdout'].strip()}, then proxytune runs again"}
    out["failed"] = r.returncode not in a["ok"]         # stated: Ansible fails any rc but 0 otherwise
    if out["failed"]:
        out["msg"] = f"proxytune exited {r.returncode}"
    return out


def run_cli(argv: list[str]) -> int:
    """`--run DEPS CLI_PY ARGS...`: the missing modules named (exit 3), or cli.py run here."""
    if len(argv) < 2 or argv[0] not in DEPS:
        print("usage: fleet_unpack.py --run install|no-install|after-apt CLI_PY ARGS...", file=sys.stderr)
        return 2
    deps, cli, args = argv[0], argv[1], argv[2:]
    missing = missing_packages()
    if missing and deps == "install":
        print(" ".join(missing))
        return 3
    if missing:
        why = "--no-install: not installed" if deps == "no-install" else "still missing after apt"
        print(f"proxytune needs the Debian packages {' '.join(missing)} on this host ({why})", file=sys.stderr)
        return 3
    sys.argv = [cli, *args]
    sys.path.insert(0, os.path.dirname(cli))           # as `python3 cli.py` would have it
    runpy.run_path(cli, run_name="__main__")
    return 0


def module_main() -> int:
    try:
        out = serve(json.loads(ARGS))
    except Exception as e:           # an answer Ansible can read, whatever went wrong
        out = {"failed": True, "msg": f"proxytune fleet module: {type(e).__name__}: {e}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if ARGS.startswith("{"):
        sys.exit(module_main())
    sys.exit(run_cli(sys.argv[2:] if sys.argv[1:2] == ["--run"] else []))
