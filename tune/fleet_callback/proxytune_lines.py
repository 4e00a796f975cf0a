"""Ansible stdout callback for `proxytune fleet`: one JSON line per host and
task as it finishes, so proxytune shows progress per host and reads each
host's result without parsing Ansible's human output.

Loaded by ansible-playbook itself (ANSIBLE_CALLBACK_PLUGINS), never imported
by proxytune.
"""

import json
import sys

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: proxytune_lines
type: stdout
short_description: one JSON line per host and task, for proxytune fleet
description: Writes each task result as a JSON object on its own line.
"""

KEEP = ("rc", "stdout", "stderr", "msg", "changed")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "proxytune_lines"

    def _emit(self, event, result):
        res = result._result
        line = {"event": event, "host": result._host.get_name(), "task": result._task.get_name()}
        line.update({k: res[k] for k in KEEP if k in res})
        sys.stdout.write(json.dumps(line, default=str) + "\n")
        sys.stdout.flush()

    def v2_runner_on_ok(self, result):
        self._emit("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._emit("ignored" if ignore_errors else "failed", result)

    def v2_runner_on_unreachable(self, result):
        self._emit("unreachable", result)

    def v2_runner_on_skipped(self, result):
        self._emit("skipped", result)

    def v2_playbook_on_no_hosts_remaining(self):
        sys.stdout.write(json.dumps({"event": "stopped"}) + "\n")
