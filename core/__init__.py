"""What every package builds on: errors, the console, /proc readers, process
groups, run directories, reading a target's files and sockets as it would,
statistics, the C compiler, and the one way of saying a mechanism is
unavailable.

core/ imports nothing from proxies/, tune/, probes/, microbench/ or reports/
(tests/test_layers.py)."""
