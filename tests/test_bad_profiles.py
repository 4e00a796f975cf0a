"""Bad input: every malformed profile gives one line `file:line: key: problem`,
exit 2, and changes nothing (no journal, no file under the sandbox root).

The line each error must name is marked in the profile text with `# <-`.
"""

import textwrap

import pytest

HEAD = '[profile]\ndescription = "t"\nos = "linux"\n'
SETTING = 'reason = "r"\nsource = "s"\n'

CASES = {
    "toml-syntax": ('[profile  # <-\nos = "linux"\n', None, "TOML syntax error"),
    "toml-syntax-mid-file": (HEAD + '[sysctl."fs.file-max"]\nat_least = = 1  # <-\n' + SETTING, None,
                             "TOML syntax error"),
    "no-profile-table": ('[sysctl."fs.file-max"]  # <-\nat_least = 1\n' + SETTING, None, "missing [profile]"),
    "unknown-os": ('[profile]\nos = "plan9"  # <-\n', "profile.os", "os must be one of"),
    "unknown-profile-key": (HEAD + 'colour = "red"  # <-\n', "profile.colour", "unknown key"),
    "include-not-list": ('[profile]\nos = "linux"\ninclude = "linux/proxy"  # <-\n', "profile.include", "expected list"),
    "unknown-backend": (HEAD + '[sysctls."fs.file-max"]  # <-\nat_least = 1\n' + SETTING, "sysctls", "unknown backend"),
    "unknown-field": (HEAD + '[sysctl."fs.file-max"]\nat_least = 1\natleast = 5  # <-\n' + SETTING,
                      "sysctl:fs.file-max", "unknown field 'atleast'"),
    "critical-not-bool": (HEAD + '[sysctl."fs.file-max"]\nat_least = 1\ncritical = "yes"  # <-\n' + SETTING,
                          "sysctl:fs.file-max", "critical is true or false"),
    "two-modes": (HEAD + '[sysctl."fs.file-max"]  # <-\nat_least = 1\nvalue = 2\n' + SETTING,
                  "sysctl:fs.file-max", "needs exactly one of"),
    "no-mode": (HEAD + '[sysctl."fs.file-max"]  # <-\n' + SETTING, "sysctl:fs.file-max", "needs exactly one of"),
    "no-reason": (HEAD + '[sysctl."fs.file-max"]  # <-\nat_least = 1\nsource = "s"\n',
                  "sysctl:fs.file-max", "'reason'"),
    "empty-source": (HEAD + '[sysctl."fs.file-max"]\nat_least = 1\nreason = "r"\nsource = ""  # <-\n',
                     "sysctl:fs.file-max", "'source'"),
    "wrong-type-int": (HEAD + '[sysctl."net.core.somaxconn"]\nat_least = "lots"  # <-\n' + SETTING,
                       "sysctl:net.core.somaxconn", "expected an integer"),
    "out-of-range": (HEAD + '[sysctl."net.ipv4.tcp_tw_reuse"]\nvalue = 7  # <-\n' + SETTING,
                     "sysctl:net.ipv4.tcp_tw_reuse", "out of range 0..2"),
    "negative": (HEAD + '[sysctl."fs.aio-max-nr"]\nat_least = -5  # <-\n' + SETTING,
                 "sysctl:fs.aio-max-nr", "out of range"),
    "inverted-port-range": (HEAD + '[sysctl."net.ipv4.ip_local_port_range"]\ncovers = [65535, 1024]  # <-\n' + SETTING,
                            "sysctl:net.ipv4.ip_local_port_range", "inverted port range"),
    "port-out-of-range": (HEAD + '[sysctl."net.ipv4.ip_local_port_range"]\ncovers = [0, 70000]  # <-\n' + SETTING,
                          "sysctl:net.ipv4.ip_local_port_range", "within 1..65535"),
    "covers-one-number": (HEAD + '[sysctl."net.core.somaxconn"]\ncovers = 5  # <-\n' + SETTING,
                          "sysctl:net.core.somaxconn", "covers takes a range"),
    "list-of-strings": (HEAD + '[sysctl."net.ipv4.ip_local_port_range"]\ncovers = ["a", "b"]  # <-\n' + SETTING,
                        "sysctl:net.ipv4.ip_local_port_range", "list of integers"),
    "bad-sysctl-name": (HEAD + '[sysctl."Bad Name!"]\nvalue = 1  # <-\n' + SETTING,
                        "sysctl:Bad Name!", "not a sysctl name"),
    "nofile-above-nr-open": (HEAD + '[rlimit."squid:nofile"]\nat_least = 2000000000  # <-\n' + SETTING,
                             "rlimit:squid:nofile", "exceeds fs.nr_open"),
    "nofile-above-profile-nr-open": (HEAD + '[sysctl."fs.nr_open"]\nat_least = 100000\n' + SETTING +
                                     '[service."squid:LimitNOFILE"]\nat_least = 200000  # <-\n' + SETTING,
                                     "service:squid:LimitNOFILE", "exceeds fs.nr_open (100000)"),
    "unknown-rlimit": (HEAD + '[rlimit."squid:nofiles"]\nat_least = 5  # <-\n' + SETTING,
                       "rlimit:squid:nofiles", "unknown limit"),
    "rlimit-exact-mode": (HEAD + '[rlimit."squid:nofile"]\nvalue = 5  # <-\n' + SETTING,
                          "rlimit:squid:nofile", "take at_least"),
    "unknown-directive": (HEAD + '[service."squid:LimitFOO"]\nvalue = 5  # <-\n' + SETTING,
                          "service:squid:LimitFOO", "unknown directive"),
    "unknown-placeholder": (HEAD + '[mount."{cachedir}:noatime"]  # <-\nvalue = true\n' + SETTING,
                            "mount:{cachedir}:noatime", "unknown placeholder"),
    "mount-not-bool": (HEAD + '[mount."/var/spool/squid:noatime"]\nvalue = "yes"  # <-\n' + SETTING,
                       "mount:/var/spool/squid:noatime", "true or false"),
    "unknown-mount-option": (HEAD + '[mount."/var/spool/squid:nodiratime"]\nvalue = true  # <-\n' + SETTING,
                             "mount:/var/spool/squid:nodiratime", "unknown mount option"),
    "unknown-param": (HEAD + '[params]\ncolour = 1  # <-\n', "params.colour", "unknown parameter"),
    "param-wrong-type": (HEAD + '[params]\ncache_dirs = "/var/spool/squid"  # <-\n', "params.cache_dirs",
                         "expected list"),
    "linux-backend-on-freebsd": ('[profile]\nos = "freebsd"\n[rlimit."squid:nofile"]  # <-\nat_least = 5\n' + SETTING,
                                 "rlimit", "unknown backend for freebsd"),
    "freebsd-inverted-ports": ('[profile]\nos = "freebsd"\n[sysctl."net.inet.ip.portrange.first"]\n'
                               'at_most = 60000  # <-\n' + SETTING + '[sysctl."net.inet.ip.portrange.last"]\n'
                               'at_least = 1024\n' + SETTING, "sysctl:net.inet.ip.portrange.first",
                               "inverted port range"),
    "include-missing": ('[profile]\nos = "linux"\ninclude = ["no/such"]  # <-\n', "profile.include", "no such profile"),
    "include-other-os": ('[profile]\nos = "freebsd"\ninclude = ["linux/proxy"]  # <-\n', "profile.include",
                         "for linux"),
}


def marked_line(text: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if "# <-" in line)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_profile_is_one_clear_line_and_changes_nothing(name, tmp_path, sandbox, cli):
    text, key, problem = CASES[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    before = sorted(p for p in sandbox.root.rglob("*"))
    for command in (["tune", "check"], ["tune", "apply", "--yes", "--persist"], ["tune", "export", "--format", "ansible"]):
        result = cli(*command, "--profile", str(path))
        assert result.exit_code == 2, (command, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 2 and lines[1].startswith("hint:"), lines
        error = lines[0]
        assert f"{path}:{marked_line(text)}:" in error, error
        if key:
            assert key in error, error
        assert problem in error, error
        assert "Traceback" not in result.output
    assert not sandbox.state_dir.exists(), "a journal was written for a bad profile"
    assert sorted(p for p in sandbox.root.rglob("*")) == before


def test_include_loop_names_the_chain(tmp_path, sandbox, cli):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('[profile]\nos = "linux"\ninclude = ["b.toml"]\n')
    b.write_text('[profile]\nos = "linux"\ninclude = ["a.toml"]\n')
    result = cli("tune", "check", "--profile", str(a))
    assert result.exit_code == 2
    assert f"{b}:3: profile.include: include loop: a.toml -> b.toml -> a.toml" in result.stderr


def test_self_include(tmp_path, sandbox, cli):
    a = tmp_path / "self.toml"
    a.write_text('[profile]\nos = "linux"\ninclude = ["self.toml"]\n')
    result = cli("tune", "check", "--profile", str(a))
    assert result.exit_code == 2 and "include loop" in result.stderr


def test_unknown_profile_name(sandbox, cli):
    result = cli("tune", "check", "--profile", "linux/nope")
    assert result.exit_code == 2 and "no such profile" in result.stderr and "linux/proxy" in result.stderr


def test_at_least_20_malformed_cases():
    assert len(CASES) + 2 >= 20
