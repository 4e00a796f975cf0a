"""Hostile input and host files as they really are (issue 10, items 5-7).

Every case asserts the exit code, the one line that names the option or
FILE:LINE, and that the sandbox (files with mode and owner, sysctls, mounts,
loop devices) is as it was. Classes: option values with control characters,
shell metacharacters, look-alikes and length; profile names and values for
every backend; malformed host files of every kind; a later sysctl.d file
overriding ours at boot.
"""

import json
import os
import subprocess

import pytest

from conftest import REPO, in_netns, needs_root, proxytune
from snapshot import SandboxState
from test_bad_profiles import marked_line
from proxytune.tune.backends.mount import mount_of

SYSCTLS = ("net.core.somaxconn", "fs.file-max", "fs.nr_open", "kernel.core_pattern")
COMMANDS = (["tune", "check"], ["tune", "plan", "--persist"], ["tune", "apply", "--yes", "--persist"],
            ["tune", "export", "--format", "ansible"])


def take(host, tmp_path) -> SandboxState:
    return SandboxState.take(host.root, host.state_dir, tmp_path / "out", sysctl_names=SYSCTLS)


def assert_unchanged(before: SandboxState, after: SandboxState, tmp_path) -> None:
    """Files and sysctls exactly; mounts, loops and /tmp leftovers only where this run could
    have made them (other test runs share the machine), everything on a quiet CI machine."""
    strict = os.environ.get("CI") == "true"
    diff = [d for d in before.diff(after)
            if strict or d.startswith(("file ", "sysctl ")) or str(tmp_path) in d]
    assert diff == [], diff


def one_error(stderr: str) -> str:
    """The `proxytune: error:` line, checking it is the only one (plus an optional hint)."""
    lines = stderr.strip().splitlines()
    assert lines and lines[0].startswith("proxytune: error: "), lines
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint:")), lines
    assert "Traceback" not in stderr
    return lines[0]


# ------------------------------------------------------------ option values

OPTION_CASES = {
    "service-trailing-newline": (["--service", "squid\n"], "--service:", "control character '\\n'"),
    "service-carriage-return": (["--service", "squid\r"], "--service:", "control character '\\r'"),
    "service-nul": (["--service", "squid\x00x"], "--service:", "control character '\\x00'"),
    "service-semicolon": (["--service", "squid;id"], "--service:", "not a service name"),
    "service-command-substitution": (["--service", "$(id)"], "--service:", "not a service name"),
    "service-backticks": (["--service", "`id`"], "--service:", "not a service name"),
    "service-quote": (["--service", "squid'x"], "--service:", "not a service name"),
    "service-option-like": (["--service", "-squid"], "--service:", "not a service name"),
    "service-look-alike": (["--service", "\u0455quid"], "--service:", "not a service name: '\\u0455quid'"),
    "service-line-separator": (["--service", "squid\u2028x"], "--service:", "control character '\\u2028'"),
    "cache-dir-bidi-override": (["--cache-dir", "/var/spool/\u202ediuqs"], "--cache-dir:", "'\\u202e'"),
    "service-very-long": (["--service", "s" * 300], "--service:", "longer than 200"),
    "service-empty": (["--service", ""], "--service:", "empty"),
    "user-hash": (["--user", "#x"], "--user:", "not a user name"),
    "user-tab": (["--user", "pro\txy"], "--user:", "control character '\\t'"),
    "user-colon": (["--user", "proxy:x"], "--user:", "not a user name"),
    "user-dollar": (["--user", "$USER"], "--user:", "not a user name"),
    "cache-dir-relative": (["--cache-dir", "spool/squid"], "--cache-dir:", "not an absolute path"),
    "cache-dir-dotdot": (["--cache-dir", "/var/spool/../../etc"], "--cache-dir:", "'..' part"),
    "cache-dir-newline": (["--cache-dir", "/var/spool/squid\n/etc"], "--cache-dir:", "control character"),
    "cache-dir-placeholder": (["--cache-dir", "/var/{service}"], "--cache-dir:", "brace"),
    "cache-dir-trailing-space": (["--cache-dir", "/var/spool/squid "], "--cache-dir:", "ends with a space"),
}


@pytest.mark.parametrize("name", sorted(OPTION_CASES))
def test_hostile_option_is_refused_against_the_option(name, sandbox, cli, tmp_path):
    args, prefix, problem = OPTION_CASES[name]
    out = tmp_path / "out"
    out.mkdir()
    export = ["tune", "export", "--format", "sysctl.d", "-o", str(out / "x.conf")]
    refused_everywhere(cli, sandbox, tmp_path, COMMANDS + (export,), args, (f"proxytune: error: {prefix} ", problem))


def refused_everywhere(cli, sandbox, tmp_path, commands, args, fragments) -> None:
    """Each command exits 2 with one error line holding every fragment; no journal, nothing changed."""
    before = take(sandbox, tmp_path)
    for command in commands:
        result = cli(*command, *args)
        assert result.exit_code == 2, (command, result.output)
        line = one_error(result.stderr)
        assert all(f in line for f in fragments), (fragments, line)
    assert not sandbox.state_dir.exists()
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)


# ------------------------------------------------------------ profile names and values

HEAD = '[profile]\ndescription = "t"\nos = "linux"\n'
BSD = '[profile]\nos = "freebsd"\n'
TEXT = 'reason = "r"\nsource = "s"\n'

PROFILE_CASES = {
    "sysctl-string-newline": (HEAD + '[sysctl."kernel.core_pattern"]\nvalue = "core\\nkernel.core_pattern = |/tmp/x"'
                              '  # <-\n' + TEXT, "sysctl:kernel.core_pattern", "control character '\\n'"),
    "sysctl-string-cr": (HEAD + '[sysctl."kernel.core_pattern"]\nvalue = "core\\r"  # <-\n' + TEXT,
                         "sysctl:kernel.core_pattern", "control character '\\r'"),
    "sysctl-numbers-newline": (HEAD + '[sysctl."net.ipv4.ip_local_port_range"]\ncovers = "1024\\n65535"  # <-\n'
                               + TEXT, "sysctl:net.ipv4.ip_local_port_range", "control character"),
    "sysctl-string-next-line": (HEAD + '[sysctl."kernel.core_pattern"]\nvalue = "core\\u0085x"  # <-\n' + TEXT,
                                "sysctl:kernel.core_pattern", "control character '\\x85'"),
    "sysctl-string-too-long": (HEAD + f'[sysctl."kernel.core_pattern"]\nvalue = "{"x" * 5000}"  # <-\n' + TEXT,
                               "sysctl:kernel.core_pattern", "longer than 4096"),
    "sysctl-above-64-bits": (HEAD + '[sysctl."fs.file-max"]\nat_least = "99999999999999999999999"  # <-\n' + TEXT,
                             "sysctl:fs.file-max", "does not fit in 64 bits"),
    "sysctl-name-newline": (HEAD + '[sysctl."net.core.somaxconn\\n"]  # <-\nat_least = 1\n' + TEXT,
                            "sysctl:net.core.somaxconn\\n", "control character"),
    "sysctl-name-look-alike": (HEAD + '[sysctl."net.core.somax\u0441onn"]\nat_least = 1  # <-\n' + TEXT,
                               "sysctl:net.core.somax", "not a sysctl name"),
    "limits-domain-comment": (HEAD + '[limits."#x:nofile"]\nat_least = 1024  # <-\n' + TEXT,
                              "limits:#x:nofile", "not a limits.conf domain"),
    "limits-domain-semicolon": (HEAD + '[limits."a;b:nofile"]\nat_least = 1024  # <-\n' + TEXT,
                                "limits:a;b:nofile", "not a limits.conf domain"),
    "limits-memlock-unbounded": (HEAD + '[limits."proxy:memlock"]\nat_least = 9999999999999999  # <-\n' + TEXT,
                                 "limits:proxy:memlock", "out of range 1..1099511627776"),
    "rlimit-service-substitution": (HEAD + '[rlimit."$(id):nofile"]\nat_least = 1024  # <-\n' + TEXT,
                                    "rlimit:$(id):nofile", "not a process name"),
    "rlimit-nproc-unbounded": (HEAD + '[rlimit."squid:nproc"]\nat_least = 100000000  # <-\n' + TEXT,
                               "rlimit:squid:nproc", "out of range 1..4194304"),
    "service-unit-backticks": (HEAD + '[service."`id`:LimitNOFILE"]\nat_least = 1024  # <-\n' + TEXT,
                               "service:`id`:LimitNOFILE", "not a service name"),
    "service-limitnproc-unbounded": (HEAD + '[service."squid:LimitNPROC"]\nat_least = 100000000  # <-\n' + TEXT,
                                     "service:squid:LimitNPROC", "out of range 1..4194304"),
    "mount-path-dotdot": (HEAD + '[mount."/var/../etc:noatime"]\nvalue = true  # <-\n' + TEXT,
                          "mount:/var/../etc:noatime", "'..' part"),
    "reason-newline": (HEAD + '[sysctl."fs.file-max"]\nat_least = 1\nreason = "a\\nb"  # <-\nsource = "s"\n',
                       "sysctl:fs.file-max", "control character"),
    "param-service-space": (HEAD + '[params]\nservice = "squid proxy"  # <-\n', "params.service",
                            "not a service name"),
    "param-cache-dir-relative": (HEAD + '[params]\ncache_dirs = ["cache"]  # <-\n', "params.cache_dirs",
                                 "not an absolute path"),
    "freebsd-login-class-colon": (BSD + '[login."dae:mon:openfiles"]\nat_least = 1024  # <-\n' + TEXT,
                                  "login:dae:mon:openfiles", "not a login class"),
    "freebsd-sysctl-trailing-newline": (BSD + '[sysctl."kern.maxfiles\\n"]  # <-\nat_least = 1\n' + TEXT,
                                        "sysctl:kern.maxfiles\\n", "control character"),
}


@pytest.mark.parametrize("name", sorted(PROFILE_CASES))
def test_hostile_profile_is_refused_at_load_naming_file_line(name, sandbox, cli, tmp_path):
    text, label, problem = PROFILE_CASES[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    export = ["tune", "export", "--format", "freebsd" if "freebsd" in name else "sysctl.d"]
    refused_everywhere(cli, sandbox, tmp_path, COMMANDS + (export,), ["--profile", str(path)],
                       (f"{path}:{marked_line(text)}: {label}", problem))


# ------------------------------------------------------------ host files as they really are

LIMITS = "etc/security/limits.conf"
LIMITS_D = "etc/security/limits.d/10-local.conf"
DROPIN = "etc/systemd/system/ptadv.service.d/override.conf"
QUIET = ["--service", "ptadv", "--user", "proxy"]   # no such process: no observation warnings
SYSCTL_D = "etc/sysctl.d/95-local.conf"

HOST_CASES = {
    "limits-64k": ({LIMITS: "# local\nproxy soft nofile 64k\n"}, "limits:*", LIMITS, 2,
                   "value '64k' is not a number, -1 or unlimited; pam_limits reads it as 64"),
    "limits-hard-line-64k": ({LIMITS_D: "proxy soft nofile 65536\nproxy hard nofile 64k\n"}, "limits:*", LIMITS_D, 2,
                             "pam_limits reads it as 64"),
    "limits-three-fields": ({LIMITS_D: "proxy soft nofile\n"}, "limits:*", LIMITS_D, 1, "3 fields"),
    "limits-bad-type": ({LIMITS: "\n\nproxy sfot nofile 4096\n"}, "limits:*", LIMITS, 3, "type 'sfot'"),
    "limits-not-utf8": ({LIMITS: b"proxy soft nofile 1\xff\n"}, "limits:*", LIMITS, None, "not UTF-8"),
    "limits-is-a-directory": ({LIMITS + "/x": ""}, "limits:*", LIMITS, None, "cannot read: not a regular file"),
    "limits-is-a-fifo": ({LIMITS: "fifo"}, "limits:*", LIMITS, None, "cannot read: not a regular file"),
    "limits-is-dev-zero": ({LIMITS: "->/dev/zero"}, "limits:*", LIMITS, None, "cannot read: not a regular file"),
    "systemd-minus-one": ({DROPIN: "[Service]\nLimitNOFILE=-1\n"}, "service:*", DROPIN, 2,
                          "LimitNOFILE='-1' is not a number"),
    "systemd-unlimited": ({DROPIN: "[Service]\nLimitNOFILE=unlimited\n"}, "service:*", DROPIN, 2,
                          "systemd ignores this line"),
    "systemd-64k": ({DROPIN: "[Service]\nLimitNOFILE = 64k\n"}, "service:*", DROPIN, 2, "'64k'"),
    "systemd-default-garbage": ({"etc/systemd/system.conf": "[Manager]\nDefaultLimitNOFILE=lots\n"},
                                "service:*", "etc/systemd/system.conf", 2, "DefaultLimitNOFILE='lots'"),
    "sysctl-d-no-equals": ({SYSCTL_D: "# x\nnet.core.somaxconn 65535\n"}, "sysctl:net.core.somaxconn", SYSCTL_D, 2,
                           "not a `key = value` line"),
    "sysctl-d-not-a-number": ({"etc/sysctl.d/99-local.conf": "net.core.somaxconn = lots\n"},
                              "sysctl:net.core.somaxconn", "etc/sysctl.d/99-local.conf", 1, "= 'lots'"),
}


def write_host_files(root, files: dict) -> None:
    """Files under root: text, bytes, "fifo" for a named pipe, "->TARGET" for a symlink."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "fifo":
            os.mkfifo(path)
        elif isinstance(content, str) and content.startswith("->"):
            path.symlink_to(content[2:])
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())


def check_json(result_stdout: str, only: str) -> dict:
    doc = json.loads(result_stdout)["data"]
    return next(s for s in doc["settings"] if s["setting"].startswith(only.rstrip("*")))


@needs_root
@pytest.mark.parametrize("name", sorted(HOST_CASES))
def test_malformed_host_file_is_status_error_with_file_line(name, sandbox, tmp_path):
    files, only, rel, line, problem = HOST_CASES[name]
    write_host_files(sandbox.root, files)
    where = f"{sandbox.root / rel}:{line}:" if line else f"{sandbox.root / rel}:"
    params = ["--only", only, *QUIET]
    before = take(sandbox, tmp_path)
    check = proxytune("tune", "check", "--json", *params, netns=True)
    assert check.returncode == 2 and "Traceback" not in check.stderr, check.stderr
    setting = check_json(check.stdout, only)
    assert setting["status"] == "error" and setting["error"].startswith(where), setting
    assert problem in setting["error"], setting
    plan = proxytune("tune", "plan", "--persist", *params, netns=True)
    assert plan.returncode == 2 and "error" in plan.stdout and "Traceback" not in plan.stderr
    apply = proxytune("tune", "apply", "--yes", "--persist", *params, netns=True)
    assert apply.returncode == 2
    error = one_error(apply.stderr)
    assert where in error and problem in error and "--skip" in apply.stderr, error
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)


@needs_root
def test_unreadable_host_file_eacces_is_status_error(sandbox, tmp_path):
    """Root without CAP_DAC_OVERRIDE (setpriv) meets a 0000 limits.conf owned by nobody."""
    write_host_files(sandbox.root, {LIMITS: "proxy soft nofile 65536\n"})
    os.chmod(sandbox.root / LIMITS, 0)
    os.chown(sandbox.root / LIMITS, 65534, 65534)
    before = take(sandbox, tmp_path)
    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search"]
    argv = [*drop, str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "tune", "check", "--json",
            "--only", "limits:*", "--service", "ptadv", "--user", "proxy"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    setting = check_json(r.stdout, "limits:*")
    assert setting["status"] == "error"
    assert setting["error"] == f"{sandbox.root / LIMITS}: cannot read: Permission denied"
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)


@needs_root
def test_broken_fstab_entry_for_the_cache_mount_is_an_error(sandbox, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    mountpoint = mount_of(str(cache))[0]
    write_host_files(sandbox.root, {"etc/fstab": f"# static\n/dev/nonexistent {mountpoint.replace(' ', chr(92) + '040')}\n"})
    before = take(sandbox, tmp_path)
    params = ["--only", "mount:*", "--cache-dir", str(cache)]
    check = proxytune("tune", "check", "--json", *params)
    assert check.returncode == 2, check.stderr
    setting = check_json(check.stdout, "mount:")
    assert setting["status"] == "error"
    assert setting["error"].startswith(f"{sandbox.root}/etc/fstab:2: fstab entry for {mountpoint} has 2 fields")
    apply = proxytune("tune", "apply", "--yes", "--persist", *params)
    assert apply.returncode == 2 and f"{sandbox.root}/etc/fstab:2:" in one_error(apply.stderr)
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)


VALID_CASES = {     # what systemd and pam_limits accept is read, not refused
    "systemd-empty-is-a-reset": ({"lib/systemd/system/ptadv.service": "[Service]\nLimitNOFILE=65536\n",
                                  DROPIN: "[Service]\nLimitNOFILE=\n"}, "service:*", 1, 1024),
    "systemd-infinity": ({DROPIN: "[Service]\nLimitNOFILE=infinity\n"}, "service:*", 0, "infinity"),
    "systemd-soft-hard": ({DROPIN: "[Service]\nLimitNOFILE=1024:524288\n"}, "service:*", 1, 1024),
    "systemd-bad-line-then-good": ({DROPIN: "[Service]\nLimitNOFILE=lots\nLimitNOFILE=70000\n"},
                                   "service:*", 0, 70000),
    "limits-minus-one": ({LIMITS: "proxy - nofile -1  # no limit\n"}, "limits:*", 0, "unlimited"),
}


@pytest.mark.parametrize("name", sorted(VALID_CASES))
def test_valid_host_values_are_read_as_their_consumer_reads_them(name, sandbox, tmp_path):
    files, only, code, current = VALID_CASES[name]
    write_host_files(sandbox.root, files)
    before = take(sandbox, tmp_path)
    r = proxytune("tune", "check", "--json", "--only", only, *QUIET)
    assert r.returncode == code, r.stderr
    assert check_json(r.stdout, only)["current"] == current
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)


# ------------------------------------------------------------ persistence overridden at boot

OURS = "etc/sysctl.d/90-proxytune.conf"
SOMAXCONN = ["--only", "sysctl:net.core.somaxconn", "--service", "ptadv"]


@needs_root
@pytest.mark.parametrize("rel", ["etc/sysctl.d/99-local.conf", "usr/lib/sysctl.d/95-vendor.conf",
                                 "etc/sysctl.conf"])
def test_persisted_setting_undone_at_boot_is_not_met(sandbox, tmp_path, rel):
    write_host_files(sandbox.root, {OURS: "net.core.somaxconn = 8192\n", rel: "# local\nnet.core.somaxconn = 128\n"})
    before = take(sandbox, tmp_path)
    r = in_netns("echo 8192 > /proc/sys/net/core/somaxconn; $PT tune check --json " + " ".join(SOMAXCONN))
    assert r.returncode == 1, r.stderr           # live value met, boot would undo it: drift
    setting = check_json(r.stdout, "sysctl:")
    assert setting["current"] == 8192 and setting["status"] == "drift" and setting["target"] is None
    expected = f"overridden at boot by {sandbox.root / rel}:2 (net.core.somaxconn = 128)"
    assert setting["boot_override"] == expected and expected in setting["note"]
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)


@needs_root
def test_plan_and_apply_persist_warn_about_a_later_file(sandbox, tmp_path):
    later = sandbox.root / "etc/sysctl.d/99-local.conf"
    write_host_files(sandbox.root, {"etc/sysctl.d/99-local.conf": "net.core.somaxconn = 128\n"})
    before = take(sandbox, tmp_path)
    plan = proxytune("tune", "plan", "--persist", "--json", *SOMAXCONN, netns=True)
    assert plan.returncode == 1
    doc = json.loads(plan.stdout)["data"]
    assert any(f"overridden at boot by {later}:1" in n for n in doc["step_notes"]), doc["step_notes"]
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)
    apply = proxytune("tune", "apply", "--yes", "--persist", *SOMAXCONN, netns=True)
    assert f"proxytune: warning: sysctl:net.core.somaxconn: overridden at boot by {later}:1" in apply.stderr
    assert (sandbox.root / OURS).read_text().endswith("net.core.somaxconn = 8192\n")   # written, as documented


@needs_root
def test_earlier_file_is_masked_by_ours_and_not_reported(sandbox, tmp_path):
    write_host_files(sandbox.root, {OURS: "net.core.somaxconn = 8192\n",
                                    "usr/lib/sysctl.d/10-vendor.conf": "net.core.somaxconn = 128\n"})
    r = in_netns("echo 8192 > /proc/sys/net/core/somaxconn; $PT tune check --json " + " ".join(SOMAXCONN))
    assert r.returncode == 0, r.stderr
    setting = check_json(r.stdout, "sysctl:")
    assert setting["status"] == "met" and setting["boot_override"] is None


def test_at_least_25_adversarial_cases():
    count = len(OPTION_CASES) + len(PROFILE_CASES) + len(HOST_CASES) + len(VALID_CASES) + 3 + 3 + 2 + 3 + 2 + 1
    assert count >= 25, count


@pytest.mark.host  # the audit runs ss (the tier: tests/tiers.py)
def test_doctor_audit_keeps_working_on_a_malformed_host_file(sandbox):
    """doctor's host audit shows the setting in error instead of failing."""
    from proxytune.probes import doctor
    write_host_files(sandbox.root, {LIMITS: "ptadv soft nofile 64k\n"})    # the user defaults to the service
    audit = doctor.audit(sandbox, "linux/proxy", "ptadv", [])
    assert audit["available"] and audit["summary"]["error"] >= 1, audit


@pytest.mark.parametrize("args, fragment", [
    (["--only", "nothing\nproxytune: error: forged"], "--only/--skip nothing\\nproxytune: error: forged"),
    (["--profile", "no/such\n\x1b[2J"], "contains the control character"),
])
def test_any_error_message_stays_one_line(args, fragment, sandbox, cli, tmp_path):
    before = take(sandbox, tmp_path)
    result = cli("tune", "check", *args)
    assert result.exit_code == 2
    assert fragment in one_error(result.stderr)
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)


def test_fstab_path_with_a_space_is_matched_escaped_and_kept_escaped():
    from proxytune.tune import fstab
    text = "# x\n/dev/sdb1 /var/spool/my\\040cache ext4 defaults 0 2\n"
    assert fstab.find_entry(text, "/var/spool/my cache") == 1
    assert fstab.set_atime(text, "/var/spool/my cache", "noatime") == \
        "# x\n/dev/sdb1 /var/spool/my\\040cache ext4 defaults,noatime 0 2\n"
    fstab.check_entry(text, "/var/spool/my cache", "fstab")     # a whole entry: no error


@pytest.mark.parametrize("only, rel, text, where", [
    ("limits:*", "etc/security/limits.d/99-local.conf", "proxy soft nofile 1024\n", "at login"),
    ("service:*", "etc/systemd/system/ptadv.service.d/zz-local.conf", "[Service]\nLimitNOFILE=2048\n",
     "at service start"),
])
def test_a_later_limits_or_dropin_file_is_named_and_apply_persist_warns(sandbox, tmp_path, only, rel, text, where):
    write_host_files(sandbox.root, {rel: text})
    before = take(sandbox, tmp_path)
    plan = proxytune("tune", "plan", "--persist", "--json", "--only", only, *QUIET)
    assert plan.returncode == 1, plan.stderr
    doc = json.loads(plan.stdout)["data"]
    expected = f"overridden {where} by {sandbox.root / rel}:{text.count(chr(10))}"
    assert doc["settings"][0]["boot_override"].startswith(expected), doc["settings"][0]
    assert any(n.startswith(f"{doc['settings'][0]['setting']}: {expected}") for n in doc["step_notes"])
    assert_unchanged(before, take(sandbox, tmp_path), tmp_path)
    apply = proxytune("tune", "apply", "--yes", "--persist", "--only", only, *QUIET)
    assert apply.returncode == 1 and f"proxytune: warning: {doc['settings'][0]['setting']}: {expected}" in apply.stderr


def test_apply_goes_ahead_when_the_setting_in_error_is_skipped(sandbox, tmp_path):
    write_host_files(sandbox.root, {LIMITS: "proxy soft nofile 64k\n"})
    only = ["--only", "limits:*", "--only", "service:*", *QUIET]
    refused = proxytune("tune", "apply", "--yes", "--persist", *only)
    assert refused.returncode == 2 and "--skip 'limits:proxy:nofile'" in refused.stderr
    assert not sandbox.state_dir.exists()
    done = proxytune("tune", "apply", "--yes", "--persist", *only, "--skip", "limits:*")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (sandbox.root / "etc/systemd/system/ptadv.service.d/50-proxytune.conf").exists()
    assert not (sandbox.root / "etc/security/limits.d/90-proxytune.conf").exists()
