"""Per-program bpf_stats of the doctor's composed program, main's scripts vs this tree's, alternating,
under the overhead command's paced nginx load. Run as root from the tree's root, with MAIN_CHECKOUT a
checkout of the "before" commit (ea549e3): python docs/results/doctor-programs-ab.py 4 > out.jsonl
(the harness of docs/results/doctor-programs-ab-20261125.jsonl; not part of the tool)."""
import json, sys, statistics
from pathlib import Path
sys.path.insert(0, "tests"); import conftest
from proxytune.microbench import servers
from proxytune.core import rundir
from proxytune.probes import bpftrace, overhead, proc, hostnoise
reps = int(sys.argv[1]); out = []
TREES = {"before": Path("MAIN_CHECKOUT/probes"), "after": Path("probes")}
with hostnoise.priority(hostnoise.NICE), rundir.RunDir("ovh-progs") as d, servers.Nginx(workers=1) as ng:
    load = overhead.Load(f"http://127.0.0.1:{ng.port}/", proc.resolve(ng.pid, None), 10, 50, overhead.pace_script(d.path, 1))
    servers.wrk(load.url, 2, 50, script=load.script)
    for rep in range(reps):
        for tree in (("before", "after") if rep % 2 == 0 else ("after", "before")):
            bpftrace.HERE = TREES[tree]
            r = overhead.program_costs(load, "bpftrace")
            out.append({"rep": rep, "tree": tree, **r, "foreign": hostnoise.foreign_tracers()})
            print(json.dumps(out[-1]), flush=True)
