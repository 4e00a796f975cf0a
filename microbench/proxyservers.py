"""The proxies tests start by their old names here: each server lives with its
proxy in proxies/ now (its bench launcher is part of its spec). No module of
the tool imports this one."""

from proxytune.proxies.haproxy import HAProxyServer as HAProxy  # noqa: F401
from proxytune.proxies.nginx import NginxCache  # noqa: F401
from proxytune.proxies.trafficserver import TS_LOG_FORMAT, ATSServer as TrafficServer  # noqa: F401
from proxytune.proxies.varnish import VarnishServer as Varnish  # noqa: F401
