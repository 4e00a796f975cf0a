"""The servers tests and scripts start by their old names here: each lives with
its proxy in proxies/ now (its bench launcher is part of its spec), wrk in
proxies/launch.py. No module of the tool imports this one."""

from proxytune.proxies.launch import dead_resolver, free_port, parse_wrk, wait_port, wrk  # noqa: F401
from proxytune.proxies.nginx import NginxServer as Nginx  # noqa: F401
from proxytune.proxies.squid import SquidServer as Squid  # noqa: F401
