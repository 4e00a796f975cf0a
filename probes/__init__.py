"""Diagnose a running proxy: bpftrace scripts on stable tracepoints, perf
sampling, /proc/net counters, and rules that turn their evidence into
findings with a fix. `doctor` runs them together for a bounded window."""
