"""Profiles -> plan -> apply -> verify -> rollback, and exporters, for proxy hosts."""
