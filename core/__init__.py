"""What every package builds on: errors, the console, /proc readers, process
groups, run directories and the one way of saying a mechanism is unavailable.

core/ imports nothing from tune/, probes/, microbench/ or reports/."""
