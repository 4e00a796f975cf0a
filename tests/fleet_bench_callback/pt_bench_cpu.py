"""Ansible notification callback for tests/fleet_bench.py: at the end of each
playbook, the CPU seconds of ansible-playbook's main process (the strategy
loop, which runs on one core whatever --forks says) and of the workers it has
reaped, appended as one JSON line to $PT_BENCH_CPU_LOG. Enabled only by the
benchmark (ANSIBLE_CALLBACKS_ENABLED=pt_bench_cpu)."""

import json
import os
import resource
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: pt_bench_cpu
type: aggregate
short_description: CPU of ansible-playbook's main process, for proxytune's fleet benchmark
description: Appends the main process's own and its reaped children's CPU seconds to $PT_BENCH_CPU_LOG.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pt_bench_cpu"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("PT_BENCH_CPU_LOG")
        if not path:
            return
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        line = {"pid": os.getpid(), "at": time.time(), "hosts": len(stats.processed),
                "main_cpu_s": me.ru_utime + me.ru_stime, "reaped_children_cpu_s": kids.ru_utime + kids.ru_stime}
        with open(path, "a") as fh:
            fh.write(json.dumps(line) + "\n")
