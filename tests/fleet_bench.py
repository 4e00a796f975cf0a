"""The fleet benchmark (issue 32): `proxytune fleet check`, `apply` and
`rollback` over N namespace hosts (tests/fleet_hosts.py: each host its own
network namespace, root and state dir, reached by real ssh), timed, with the
CPU of the controller and of the hosts counted apart.

    flock /work/heavy.lock .venv/bin/python tests/fleet_bench.py --sizes 2,8,24 --repeat 3 \\
        [--tree before=/tmp/main-export --tree after=.] [--forks 5] [--out results.jsonl]

CPU is counted by cgroup (cpuacct): each host's sshd, and everything it starts
(the Ansible module, proxytune), in that host's own group; the fleet command
(proxytune, ansible, its workers, the ssh clients and masters) in another.
ansible-playbook's main process reports its own CPU through a notification
callback (tests/fleet_bench_callback): it runs the strategy loop on one core,
whatever --forks says, so it is the part a bigger controller does not spread.

Every command starts cold: the ssh masters of the one before are closed first.
--stub-host measures the controller alone at sizes this machine cannot run for
real: each host's proxytune_python is a script that prints a real `tune check
--json` document made here beforehand, so ssh, the module and its verified
unpack still run on every host, but proxytune's own audit does not.
With several --tree, the trees take turns inside each repetition, so a change
in the machine's load falls on both. check uses -p linux/proxy (read-only);
apply and rollback a profile of three per-namespace net.* settings, so nothing
outside the namespaces changes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet_hosts import NET_ONLY_PROFILE, close_masters, namespace_hosts

REPO = Path(__file__).resolve().parent.parent
CALLBACK = Path(__file__).resolve().parent / "fleet_bench_callback"
EXPECTED_EXIT = {"check": (1, 2), "apply": (0,), "rollback": (0,)}


class CpuGroups:
    """A cpuacct cgroup for the controller and one per host, removed at the end."""

    def __init__(self, hosts: list[str]):
        base = Path("/sys/fs/cgroup/cpuacct")
        if not (base / "cpuacct.usage").exists():
            raise SystemExit("fleet_bench: needs the cgroup v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct")
        self.root = base / f"pt-fleet-bench-{os.getpid()}"
        self.controller = self.root / "controller"
        self.hosts = {h: self.root / "hosts" / h for h in hosts}
        for d in (self.root, self.controller, self.root / "hosts", *self.hosts.values()):
            d.mkdir()

    @staticmethod
    def usage(group: Path) -> float:
        return int((group / "cpuacct.usage").read_text()) / 1e9

    def snapshot(self) -> dict:
        return {"controller": self.usage(self.controller), **{h: self.usage(g) for h, g in self.hosts.items()}}

    def enter_controller(self) -> None:
        """preexec_fn: the fleet command (and all it starts) into the controller's group."""
        (self.controller / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> list[str]:
        left = []
        for d in (*self.hosts.values(), self.root / "hosts", self.controller, self.root):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:            # a process still exiting
                    time.sleep(0.1)
            else:
                left.append(str(d))
        return left


STUB = """#!/bin/sh
exec cat {doc}
"""


def stub_inventory(d: Path, inventory: Path, tree: Path) -> Path:
    """The inventory with every host's proxytune_python answering a canned, real audit document."""
    doc = d / "canned-check.json"
    r = subprocess.run([sys.executable, str(tree / "cli.py"), "tune", "check", "--json", "-p", "linux/proxy"],
                       capture_output=True, text=True, env={**os.environ, "PROXYTUNE_STATE_DIR": str(d / "stub-state")})
    json.loads(r.stdout)                       # a real document, or the benchmark stops here
    doc.write_text(r.stdout)
    stub = d / "stub-python.sh"
    stub.write_text(STUB.format(doc=doc))
    stub.chmod(0o755)
    out = d / "stub-hosts.ini"
    out.write_text(inventory.read_text().replace("[proxies:vars]\n", f"[proxies:vars]\nproxytune_python={stub}\n"))
    return out


def fleet_argv(tree: Path, command: str, inventory: Path, hosts: list[str], profile: Path, forks: int) -> list[str]:
    argv = [sys.executable, str(tree / "cli.py"), "fleet", command, "-i", str(inventory), "--limit", ",".join(hosts),
            "--forks", str(forks), "--json"]
    argv += ["-p", "linux/proxy"] if command == "check" else ["-p", str(profile), "--yes"]
    return argv


def run_one(groups: CpuGroups, env: dict, argv: list[str], cpu_log: Path, hosts: list[str], cp_dir: Path) -> dict:
    """One fleet command, cold: wall time, controller CPU, ansible's main-process CPU, each host's CPU."""
    cpu_log.write_text("")
    load = os.getloadavg()[0]
    before = groups.snapshot()
    started = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800, preexec_fn=groups.enter_controller)
    wall = time.monotonic() - started
    close_masters(cp_dir)          # the hosts' sshd exit: their CPU is all counted, the next command starts cold
    time.sleep(0.5)
    after = groups.snapshot()
    plays = [json.loads(line) for line in cpu_log.read_text().splitlines() if line.strip()]
    try:
        data = json.loads(r.stdout)["data"]
        statuses = {h: data["hosts"][h]["status"] for h in hosts}
        fingerprint = next((v["fingerprint"] for v in data["hosts"].values() if v.get("fingerprint")), None)
    except (ValueError, KeyError, TypeError):
        statuses, fingerprint = {}, None
    host_cpu = {h: after[h] - before[h] for h in hosts}
    return {"exit": r.returncode, "wall_s": wall, "load1": load, "statuses": statuses,
            "controller_cpu_s": after["controller"] - before["controller"],
            "ansible_main_cpu_s": sum(p["main_cpu_s"] for p in plays), "plays": len(plays),
            "host_cpu_s": host_cpu, "fingerprint": fingerprint, "stderr_tail": r.stderr.strip().splitlines()[-3:]}


def summary(records: list[dict]) -> str:
    """Markdown: median (min-max) per tree, size and command."""
    def cell(values, fmt="{:.1f}"):
        med = statistics.median(values)
        return f"{fmt.format(med)} ({fmt.format(min(values))}–{fmt.format(max(values))})"
    keys = sorted({(r["tree"], r["hosts"], r["command"]) for r in records},
                  key=lambda k: (k[0], k[1], ["check", "apply", "rollback"].index(k[2])))
    lines = ["| tree | hosts | command | runs | wall s | controller CPU s | ansible main CPU s | host CPU s per host |",
             "|---|---:|---|---:|---|---|---|---|"]
    for tree, n, command in keys:
        rs = [r for r in records if (r["tree"], r["hosts"], r["command"]) == (tree, n, command) and r["valid"]]
        if not rs:
            lines.append(f"| {tree} | {n} | {command} | 0 valid | | | | |")
            continue
        lines.append(f"| {tree} | {n} | {command} | {len(rs)} | {cell([r['wall_s'] for r in rs])} | "
                     f"{cell([r['controller_cpu_s'] for r in rs])} | {cell([r['ansible_main_cpu_s'] for r in rs], '{:.2f}')} | "
                     f"{cell([sum(r['host_cpu_s'].values()) / n for r in rs], '{:.2f}')} |")
    return "\n".join(lines)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b*x."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def model(records: list[dict], tree: str, cores: int, hosts: int, forks=(10, 50, 100)) -> str:
    """The time for `hosts` real hosts from one controller with `cores` cores, per command, from
    the measured per-host costs: the slowest of three limits, each a floor, plus the fixed start.
      - ansible-playbook's main process, one core: hosts * main CPU per host;
      - the controller's CPU (workers, ssh), all cores: hosts * controller CPU per host / cores;
      - the forks: ceil(hosts / forks) rounds of one host's latency, taken as its own CPU (measured
        here, on a real host nothing else runs) plus the worker's CPU for it (in series).
    Network time is left out (a LAN round trip is < 1 ms against ~1 s per host)."""
    lines = ["| command | controller CPU s/host | of it, ansible main process s/host | host CPU s/host | fixed s |"
             + "".join(f" {hosts} hosts, forks {f} |" for f in forks),
             "|---|---:|---:|---:|---:|" + "---:|" * len(forks)]
    for command in ("check", "apply", "rollback"):
        rs = [r for r in records if r["tree"] == tree and r["command"] == command and r["valid"]]
        sizes = sorted({r["hosts"] for r in rs})
        if len(sizes) < 2:
            continue
        med = {n: {k: statistics.median(f(r) for r in rs if r["hosts"] == n) for k, f in (
            ("ctl", lambda r: r["controller_cpu_s"]), ("main", lambda r: r["ansible_main_cpu_s"]),
            ("host", lambda r: sum(r["host_cpu_s"].values()) / r["hosts"]), ("wall", lambda r: r["wall_s"]))}
            for n in sizes}
        ctl0, ctl = _fit([(n, med[n]["ctl"]) for n in sizes])
        _, main_cpu = _fit([(n, med[n]["main"]) for n in sizes])
        host = statistics.median(med[n]["host"] for n in sizes)
        fixed = max(0.0, _fit([(n, med[n]["wall"]) for n in sizes])[0])
        latency = host + max(0.0, ctl - main_cpu)
        cells = []
        for f in forks:
            floor = max(hosts * main_cpu, hosts * ctl / cores, -(-hosts // f) * latency)
            cells.append(f" {(fixed + floor) / 60:.1f} min |")
        lines.append(f"| {command} | {ctl:.3f} | {main_cpu:.3f} | {host:.3f} | {fixed:.1f} |" + "".join(cells))
    return "\n".join(lines)


def versions() -> dict:
    def first_line(argv):
        r = subprocess.run(argv, capture_output=True, text=True)
        return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else ""
    return {"ansible": first_line(["ansible-playbook", "--version"]), "openssh": first_line(["ssh", "-V"]),
            "python": sys.version.split()[0], "cores": os.cpu_count()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,8,24", help="host counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--commands", default="check,apply,rollback")
    ap.add_argument("--forks", type=int, default=5)
    ap.add_argument("--tree", action="append", metavar="NAME=PATH",
                    help="a proxytune tree to run (cli.py in it); repeatable; default: this checkout")
    ap.add_argument("--out", type=Path, help="append each run as a JSON line here")
    ap.add_argument("--stub-host", action="store_true",
                    help="hosts answer a canned audit instead of running proxytune (check only): the controller alone")
    ap.add_argument("--model", type=Path, metavar="RESULTS.jsonl",
                    help="no runs: the table of the runs recorded in this file (--out of one or more runs), "
                         "then the 1,000-host model from them")
    ap.add_argument("--model-tree", default="after")
    ap.add_argument("--cores", type=int, default=8)
    a = ap.parse_args()
    if a.model:
        recs = [json.loads(line) for line in a.model.read_text().splitlines() if line.strip()]
        print(summary(recs) + "\n")        # the runs of several invocations (one grid point each) together
        print(model(recs, a.model_tree, a.cores, 1000))
        return 0
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.stub_host and a.commands != "check":
        ap.error("--stub-host measures `fleet check` only (use --commands check)")
    trees = dict(t.split("=", 1) for t in a.tree) if a.tree else {"this": str(REPO)}
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    commands = a.commands.split(",")
    names = [f"px{i:03d}" for i in range(max(sizes))]
    groups = CpuGroups(names)
    records = []
    try:
        with tempfile.TemporaryDirectory(prefix="pt-fleet-bench-") as tmp, \
                namespace_hosts(Path(tmp), {h: {} for h in names}, cgroups=lambda h: groups.hosts[h]) as fh:
            d = Path(tmp)
            (d / "net-only.toml").write_text(NET_ONLY_PROFILE)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env.update(PROXYTUNE_STATE_DIR=str(d / "controller-state"), ANSIBLE_HOME=str(d / "ansible-home"),
                       ANSIBLE_SSH_CONTROL_PATH_DIR=str(d / "cp"), ANSIBLE_TIMEOUT="60",
                       ANSIBLE_CALLBACK_PLUGINS=str(CALLBACK), ANSIBLE_CALLBACKS_ENABLED="pt_bench_cpu",
                       PT_BENCH_CPU_LOG=str(d / "cpu.jsonl"))
            inventory = stub_inventory(d, fh["inventory"], next(iter(trees.values()))) if a.stub_host else fh["inventory"]
            meta = {"versions": versions(), "forks": a.forks, "trees": {k: str(v) for k, v in trees.items()},
                    "stub_host": a.stub_host}
            print(json.dumps(meta), file=sys.stderr)
            for rep in range(a.repeat):
                for n in sizes:
                    for tree_name, tree in trees.items():
                        for command in commands:
                            argv = fleet_argv(tree, command, inventory, names[:n], d / "net-only.toml", a.forks)
                            rec = run_one(groups, env, argv, d / "cpu.jsonl", names[:n], d / "cp")
                            rec.update(tree=tree_name, hosts=n, command=command, rep=rep, forks=a.forks, meta=meta,
                                       stub_host=a.stub_host)
                            rec["valid"] = rec["exit"] in EXPECTED_EXIT[command] and \
                                set(rec["statuses"].values()) == {"ok"} and len(rec["statuses"]) == n
                            records.append(rec)
                            print(f"{tree_name} {n} hosts {command} rep {rep}: {rec['wall_s']:.1f} s wall, "
                                  f"controller {rec['controller_cpu_s']:.1f} s CPU, hosts "
                                  f"{sum(rec['host_cpu_s'].values()):.1f} s CPU, exit {rec['exit']}"
                                  f"{'' if rec['valid'] else ' INVALID ' + repr(rec['stderr_tail'])}",
                                  file=sys.stderr, flush=True)
                            if a.out:
                                with open(a.out, "a") as out:
                                    out.write(json.dumps(rec) + "\n")
            close_masters(d / "cp")
    finally:
        left = groups.remove()
        if left:
            print(f"fleet_bench: cgroups still busy: {left}", file=sys.stderr)
    print(summary(records))
    return 0 if all(r["valid"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
