"""procfs.descendants from the kernel's per-thread children files, against a scan of every process:
a tree with a grandchild and a child forked by a second thread (listed under that thread, not the
leader), and a pid that is gone."""

import os
import signal
import subprocess
import sys
import time

from conftest import wait_for
from proxytune.core import procfs

TREE = """
import subprocess, sys, threading, time
kids = [subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"])]
t = threading.Thread(target=lambda: kids.append(subprocess.Popen(["sleep", "60"])))
t.start(); t.join()
print("ready", flush=True)
time.sleep(60)
"""


def test_the_tree_from_children_files_is_the_tree_a_scan_finds():
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    tree = []
    try:
        assert p.stdout.readline().strip() == "ready"
        assert wait_for(lambda: len(procfs._descendants_by_scan(p.pid)) == 5, 10)   # it, sh, 2 sleeps, 1 sleep
        tree = procfs._descendants_by_scan(p.pid)
        assert procfs.descendants(p.pid) == tree
    finally:
        for pid in reversed(tree):                       # the whole tree: no sleep outlives the test
            if pid != p.pid:
                os.kill(pid, signal.SIGKILL)
        p.kill()
        p.wait()
    time.sleep(0.1)
    assert procfs.descendants(p.pid) == [p.pid]          # gone: only itself, as the scan says
