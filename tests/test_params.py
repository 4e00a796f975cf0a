"""Parameters come from the command line, the profile, or the proxy's own config."""

from proxytune.tune import params
from proxytune.tune.host import Host


def test_squid_cache_dirs_from_squid_conf(tmp_path):
    conf = tmp_path / "etc/squid/squid.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("http_port 3128\n# cache_dir ufs /commented 100 16 256\n"
                    "cache_dir ufs /var/spool/squid 100 16 256\ncache_dir rock /cache/rock 1000\n")
    values, sources = params.resolve(Host(root=tmp_path), {"service": "squid"}, {})
    assert values["cache_dirs"] == ["/var/spool/squid", "/cache/rock"]
    assert sources["cache_dirs"] == "/etc/squid/squid.conf" and values["user"] == "proxy"


def test_nginx_proxy_cache_path(tmp_path):
    # under a root of its own no running process is read: an nginx other tests run is not this root's
    conf = tmp_path / "etc/nginx/conf.d/cache.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("proxy_cache_path /var/cache/nginx/proxy levels=1:2 keys_zone=c:10m;\n")
    values, _ = params.resolve(Host(root=tmp_path), {"service": "nginx"}, {})
    assert values["cache_dirs"] == ["/var/cache/nginx/proxy"] and values["user"] == "www-data"


def test_command_line_beats_profile_beats_detection(tmp_path):
    values, sources = params.resolve(Host(root=tmp_path), {"cache_dirs": ["/a"]},
                                     {"service": "haproxy", "cache_dirs": ["/b"]})
    assert values == {"service": "haproxy", "user": "haproxy", "cache_dirs": ["/a"]}
    assert sources["service"] == "profile" and sources["cache_dirs"] == "command line"
