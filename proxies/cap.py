"""A proxy's cap as data (each proxy module's `caps(ev)` gives them): the
directive, its value and `file:line`, how the proxy counts usage against
it, the usage at which it stops accepting, queues or refuses, what it does
there, and the source that says so. The one rule that turns a cap into a
finding is the doctor's (probes/owncap.py); the cap itself is knowledge
about the proxy, so it lives with the proxy modules."""

from dataclasses import dataclass, field


@dataclass
class Cap:
    id: str                    # the finding's id, e.g. "haproxy-maxconn"
    proxy: str
    what: str                  # "global maxconn", "worker_connections (busiest worker, pid 12)"
    directive: str             # as the operator writes it: "maxconn 200"
    limit: int | None
    where: str                 # file:line, or where the value comes from
    used: int | None           # peak usage in the window, counted as the proxy counts it
    counted: str               # how `used` was counted
    refuses_at: int | None     # usage at which the proxy stops accepting, queues or refuses
    at_cap: str                # what the proxy does there
    source: str                # the proxy's source file/function or documentation section that says so
    fix: str
    refused: dict = field(default_factory=dict)    # the proxy's own count of refusals in the window
    ports: tuple = ()          # the listener ports this cap governs; () = all of the proxy's
    estimate: bool = False     # the limit is derived by us, not read from the proxy
    extra: dict = field(default_factory=dict)      # more counters for the evidence (not refusals)

    def reached(self) -> bool:
        return self.used is not None and self.refuses_at is not None and self.used >= self.refuses_at

    def refusals(self) -> int:
        return sum(v for v in self.refused.values() if isinstance(v, int) and v > 0)
