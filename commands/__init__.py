"""proxytune's commands, one module per command group (`tune`, `fleet`, `bench`, ...).

cli.py is the root: the error boundary, the global options and the registry of
these groups. A command module parses its options and calls into the packages
that own the work (tune/, probes/, microbench/, reports/); what is left here is
how a command prints and which exit code it gives. options.py and output.py hold
what several groups share.
"""
