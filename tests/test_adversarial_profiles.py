"""A local user against root's profiles (issue 20, classes 1 and 5).

Class 1: a profile NAME is found only in the site, user and shipped catalogs,
never in root's current directory; an explicit PATH, and every file load()
opens (each include too), is trust-checked like a catalog file and read as a
capped regular file. Class 5: text an export's consumer would evaluate
(Jinja `{{ {% {#`, tuned `${`) never passes from a profile into an export,
and the playbook marks its data `!unsafe`, so Ansible never templates it.

The planted files are made by `nobody` (setpriv) in directories nobody owns,
as a local user would; root then runs proxytune there.
"""

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import REPO, needs_root
from proxytune.core.errors import ProxytuneError
from proxytune.tune import export as export_mod
from proxytune.tune.model import Setting

NOBODY, NOGROUP = 65534, 65534
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
PAYLOAD = '|/tmp/pt-evil-%p'
EVIL = f"""[profile]
description = "planted"
os = "linux"

[sysctl."kernel.core_pattern"]
value = "{PAYLOAD}"
reason = "planted by a local user"
source = "nobody"
"""
GOOD = """[profile]
description = "{what}"
os = "linux"
{include}
[sysctl."net.core.somaxconn"]
at_least = 4096
reason = "accept queue"
source = "ip-sysctl.rst"
"""


def run(*args, cwd=None, timeout=60):
    return subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


@pytest.fixture
def nobody_dir():
    """A directory in /tmp that nobody owns, filled by nobody itself; removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="pt-nobody-", dir="/tmp"))
    os.chmod(d, 0o755)
    os.chown(d, NOBODY, NOGROUP)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_nobody(script: str, cwd: Path) -> None:
    subprocess.run(AS_NOBODY + ["sh", "-euc", script], cwd=cwd, check=True, timeout=30)


def plant(d: Path) -> None:
    """./linux/proxy.toml and ./linux/proxy, written by nobody."""
    as_nobody(f"mkdir linux && cat > linux/proxy.toml <<'EOF'\n{EVIL}EOF\ncp linux/proxy.toml linux/proxy", d)


# ---------------------------------------------------------------- class 1: where profiles come from

@needs_root
def test_a_profile_name_is_never_read_from_roots_cwd(nobody_dir, sandbox):
    """The planted ./linux/proxy(.toml) changes neither the named nor the default profile."""
    plant(nobody_dir)
    for args in (["profiles", "show", "linux/proxy", "--json"],
                 ["tune", "export", "--format", "sysctl.d"],                        # the default profile
                 ["tune", "export", "--format", "sysctl.d", "-p", "linux/proxy"],
                 ["tune", "export", "--format", "sysctl.d", "-p", "linux/squid"]):  # includes linux/proxy
        r = run(*args, cwd=nobody_dir)
        assert r.returncode == 0, r.stderr
        assert "core_pattern" not in r.stdout and "pt-evil" not in r.stdout, args


@needs_root
@pytest.mark.parametrize("ref", ["./linux/proxy.toml", "linux/proxy.toml", "{d}/linux/proxy.toml"])
def test_an_explicit_path_another_user_owns_is_refused(nobody_dir, sandbox, ref):
    plant(nobody_dir)
    r = run("tune", "export", "--format", "sysctl.d", "-p", ref.format(d=nobody_dir), cwd=nobody_dir)
    assert r.returncode == 2 and "pt-evil" not in r.stdout
    assert "belongs to uid 65534" in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr


@needs_root
def test_an_explicit_path_in_a_world_writable_dir_is_refused_even_when_root_owns_it(tmp_path, sandbox):
    public = tmp_path / "public"
    public.mkdir()
    (public / "p.toml").write_text(GOOD.format(what="root's, in a 0777 dir", include=""))
    os.chmod(public, 0o777)
    r = run("profiles", "show", str(public / "p.toml"))
    assert r.returncode == 2 and "writable by others" in r.stderr, r.stderr


@needs_root
def test_an_explicit_path_root_owns_in_a_safe_dir_is_used(tmp_path, sandbox):
    (tmp_path / "p.toml").write_text(GOOD.format(what="mine", include=""))
    r = run("profiles", "show", "./p.toml", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"]["description"] == "mine"


@needs_root
@pytest.mark.parametrize("where", ["world-writable", "nobody-owned", "relative-nobody"])
def test_an_include_of_an_untrusted_file_is_refused(tmp_path, nobody_dir, sandbox, where):
    """An include naming a file in a 0777 dir, a file nobody made, or a relative name nobody planted
    beside a root-owned profile: one line naming the include, nothing read from it."""
    public = tmp_path / "public"
    public.mkdir()
    os.chmod(public, 0o777)
    (public / "evil.toml").write_text(EVIL)
    as_nobody(f"cat > evil.toml <<'EOF'\n{EVIL}EOF", nobody_dir)
    target = {"world-writable": str(public / "evil.toml"), "nobody-owned": str(nobody_dir / "evil.toml"),
              "relative-nobody": "evil.toml"}[where]
    home = tmp_path / "home"
    home.mkdir()
    main = home / "main.toml"
    main.write_text(GOOD.format(what="root's", include=f'include = ["{target}"]'))
    if where == "relative-nobody":
        shutil.copy(nobody_dir / "evil.toml", home / "evil.toml")
        os.chown(home / "evil.toml", NOBODY, NOGROUP)
    r = run("tune", "export", "--format", "sysctl.d", "-p", str(main))
    assert r.returncode == 2 and "pt-evil" not in r.stdout
    line = r.stderr.strip().splitlines()[0]
    assert line.startswith(f"proxytune: error: {main}:4: profile.include:"), r.stderr
    assert ("writable by others" in line) or ("belongs to uid 65534" in line), line


@needs_root
def test_a_catalog_symlink_to_a_user_owned_file_is_ignored(sandbox, tmp_path, nobody_dir):
    as_nobody(f"cat > proxy.toml <<'EOF'\n{EVIL}EOF", nobody_dir)
    site = sandbox.root / "etc/proxytune/profiles/linux"
    site.mkdir(parents=True)
    (site / "proxy.toml").symlink_to(nobody_dir / "proxy.toml")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "none")}
    r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "--root", str(sandbox.root),
                        "tune", "export", "--format", "sysctl.d"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "pt-evil" not in r.stdout, r.stderr


@needs_root
def test_a_fifo_or_a_huge_file_is_refused_quickly(tmp_path, sandbox):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    r = run("profiles", "show", str(fifo), timeout=30)          # the old open() blocked here forever
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    big = tmp_path / "big.toml"
    big.write_text(GOOD.format(what="big", include="") + "#" * (2 << 20) + "\n")
    r = run("profiles", "show", str(big))
    assert r.returncode == 2 and "larger than" in r.stderr, r.stderr


def test_the_rule_for_a_path_is_what_help_says():
    from proxytune.tune.profilefiles import is_path
    assert not is_path("linux/proxy") and not is_path("site/edge") and not is_path("shipped:linux/proxy")
    assert all(is_path(p) for p in ("./p.toml", "/etc/x/p.toml", "../p", "p.toml", "linux/proxy.toml"))
    r = run("tune", "check", "--help")
    assert "./" in r.stdout and ".toml" in r.stdout


# ---------------------------------------------------------------- class 5: text an export would evaluate

HEAD = '[profile]\ndescription = "t"\nos = "linux"\n'
SPOTS = {
    "reason": (HEAD + '[sysctl."net.core.somaxconn"]\nat_least = 1\nreason = "{P}"  # <-\nsource = "s"\n',
               "sysctl:net.core.somaxconn"),
    "source": (HEAD + '[sysctl."net.core.somaxconn"]\nat_least = 1\nreason = "r"\nsource = "{P}"  # <-\n',
               "sysctl:net.core.somaxconn"),
    "description": ('[profile]\ndescription = "{P}"  # <-\nos = "linux"\n', "profile.description"),
    "value": (HEAD + '[sysctl."kernel.core_pattern"]\nvalue = "{P}"  # <-\nreason = "r"\nsource = "s"\n',
              "sysctl:kernel.core_pattern"),
    "key": (HEAD + '[sysctl."net.core.{P}"]  # <-\nvalue = 1\nreason = "r"\nsource = "s"\n', None),
    "params": (HEAD + '[params]\nservice = "{P}"  # <-\n', "params.service"),
    "waive": (HEAD + '[sysctl."net.core.somaxconn"]\nat_least = 1\nreason = "r"\nsource = "s"\nwaive = "{P}"  # <-\n',
              "sysctl:net.core.somaxconn"),
}
PAYLOADS = {"jinja-expr": "{{ lookup('pipe','touch /tmp/pt-x') }}", "jinja-stmt": "{% raw %}x",
            "jinja-comment": "a {# b", "tuned-exec": "${f:exec:/bin/sh:-c:touch /tmp/pt-x}"}


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("spot", SPOTS)
def test_evaluable_text_is_refused_at_load_in_one_line(tmp_path, sandbox, cli, spot, payload):
    text, key = SPOTS[spot]
    text = text.replace("{P}", PAYLOADS[payload])
    path = tmp_path / "p.toml"
    path.write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "# <-" in l)
    r = cli("tune", "export", "--format", "ansible", "-p", str(path))
    assert r.exit_code == 2
    out = r.output.strip().splitlines()[0]
    assert out.startswith(f"proxytune: error: {path}:{line}: "), out
    if key:
        assert f": {key}: " in out, out
    assert "evaluate" in out, out


def _settings(payload: str) -> list[Setting]:
    """Settings that never went through load(): the export's own guard is what is tested."""
    return [Setting("sysctl", "net.core.somaxconn", "at_least", 1, f"reason {payload}", "s"),
            Setting("sysctl", "net.ipv4.tcp_congestion_control", "value", payload, "r", "s"),
            Setting("service", "pttest:LimitNOFILE", "at_least", 4096, f"why {payload}", "s")]


@pytest.mark.host  # asks tuned-adm its version (the tier: tests/tiers.py)
def test_tuned_export_refuses_an_exec_expansion_that_bypassed_load():
    with pytest.raises(ProxytuneError, match=r"\$\{"):
        export_mod.export("tuned", _settings("${f:exec:/bin/sh:-c:touch /tmp/pt-x}"), "p", "linux")
    with pytest.raises(ProxytuneError, match=r"\$\{"):
        export_mod.export("tuned", _settings("x"), "${f:exec:/bin/true}", "linux")


def test_playbook_marks_every_data_string_unsafe():
    book = export_mod.export("ansible", _settings("plain"), "p", "linux")
    fixed = ("reload systemd", "is systemd PID 1 here")        # ours, and a handler is notified by name
    names = [l for l in book.splitlines() if l.lstrip().startswith("- name:") and not l.endswith(fixed)]
    assert len(names) > 5 and all("!unsafe" in l for l in names), names
    assert 'value: !unsafe "plain"' in book and "content: !unsafe" in book
    assert '"plain"' not in "".join(l for l in book.splitlines() if l.lstrip().startswith("when:"))


@needs_root
@pytest.mark.skipif(not shutil.which("ansible-playbook"), reason="ansible-playbook is not installed")
def test_ansible_check_never_runs_a_lookup_in_the_playbooks_data(tmp_path):
    """The payload in a task name, a module value, a `when` comparison and a drop-in's content:
    ansible-playbook --check, run locally in a network namespace, must not run it."""
    marker = Path(f"/tmp/pt-pwned-{uuid.uuid4().hex}")
    payload = "{{ lookup('pipe', 'touch " + str(marker) + "') }}"
    book = tmp_path / "book.yml"
    book.write_text(export_mod.export("ansible", _settings(payload), "p", "linux"))
    home = tmp_path / "ansible-home"
    env = {**os.environ, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
           "ANSIBLE_REMOTE_TEMP": str(home / "rtmp"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3"}
    try:
        r = subprocess.run(["unshare", "-n", "ansible-playbook", "--check", "--diff", "-c", "local", "-i",
                            "localhost,", "-e", f"proxytune_sysctl_file={tmp_path}/s.conf",
                            "-e", f"proxytune_systemd_dir={tmp_path}/units", str(book)],
                           capture_output=True, text=True, env=env, timeout=300)
        assert not marker.exists(), "ansible ran the profile's text as code"
        assert "failed=0" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
        assert "lookup(" in r.stdout           # shown as the text it is
    finally:
        marker.unlink(missing_ok=True)


# ---------------------------------------------------------------- second round: variants not used while building

@needs_root
@pytest.mark.parametrize("ref", ["shipped:{d}/linux/proxy", "shipped:../../../..{d}/linux/proxy"])
def test_shipped_prefix_cannot_reach_outside_the_shipped_catalog(nobody_dir, sandbox, ref):
    """`shipped:` + an absolute or climbing name would replace the catalog's directory in a path join."""
    plant(nobody_dir)
    r = run("tune", "export", "--format", "sysctl.d", "-p", ref.format(d=nobody_dir))
    assert r.returncode == 2 and "pt-evil" not in r.stdout, r.stdout + r.stderr


@needs_root
def test_a_relative_xdg_config_home_is_not_the_cwd(nobody_dir, sandbox):
    """XDG_CONFIG_HOME=. (invalid by the spec) must not turn ./proxytune/profiles into a catalog."""
    as_nobody(f"mkdir -p proxytune/profiles/linux && cat > proxytune/profiles/linux/proxy.toml <<'EOF'\n{EVIL}EOF",
              nobody_dir)
    os.chown(nobody_dir, 0, 0)                   # even in a directory root owns
    subprocess.run(["chown", "-R", "root:root", str(nobody_dir / "proxytune")], check=True)
    r = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "cli.py"), "profiles", "list", "--json"],
                       capture_output=True, text=True, cwd=nobody_dir, timeout=60,
                       env={**os.environ, "XDG_CONFIG_HOME": "."})
    assert r.returncode == 0, r.stderr
    assert {row["name"]: row["source"] for row in json.loads(r.stdout)["data"]["profiles"]}["linux/proxy"] == "shipped"


@needs_root
def test_a_symlinked_include_into_a_user_dir_and_a_hardlinked_catalog_file_are_refused(tmp_path, nobody_dir, sandbox):
    """A root-owned include that is a symlink to nobody's file; a catalog file nobody swapped in by rename
    from a directory it owns (the parent belongs to nobody)."""
    as_nobody(f"cat > evil.toml <<'EOF'\n{EVIL}EOF", nobody_dir)
    home = tmp_path / "home"
    home.mkdir()
    (home / "base.toml").symlink_to(nobody_dir / "evil.toml")
    main = home / "main.toml"
    main.write_text(GOOD.format(what="root's", include='include = ["base.toml"]'))
    r = run("tune", "export", "--format", "sysctl.d", "-p", str(main))
    assert r.returncode == 2 and "belongs to uid 65534" in r.stderr and "pt-evil" not in r.stdout
    r = run("tune", "export", "--format", "sysctl.d", "-p", str(nobody_dir / "evil.toml"))
    assert r.returncode == 2 and "pt-evil" not in r.stdout


@pytest.mark.parametrize("payload", ["{{x}}", "a ${b}", "{%- if 1 %}", "{#-"])
def test_a_payload_in_an_include_entry_is_refused_before_any_lookup(tmp_path, sandbox, cli, payload):
    path = tmp_path / "p.toml"
    path.write_text(f'[profile]\nos = "linux"\ninclude = ["{payload}"]\n')
    r = cli("tune", "export", "--format", "tuned", "-p", str(path))
    assert r.exit_code == 2 and f"{path}:3: profile.include: " in r.output and "evaluate" in r.output


def test_cache_dirs_and_user_params_with_payloads_are_refused(tmp_path, sandbox, cli):
    for line in ('cache_dirs = ["/var/spool/{{ x }}"]', 'user = "${f:exec:/bin/id}"'):
        path = tmp_path / "p.toml"
        path.write_text(f'[profile]\nos = "linux"\n[params]\n{line}\n')
        r = cli("tune", "export", "--format", "ansible", "-p", str(path))
        assert r.exit_code == 2 and f"{path}:4: params." in r.output and "evaluate" in r.output, r.output


@needs_root
@pytest.mark.parametrize("ref, bundled", [("linux/proxy", None), ("./mine.toml", "profile.toml")])
def test_fleet_bundles_a_file_only_when_the_reference_is_a_path(nobody_dir, tmp_path, monkeypatch, ref, bundled):
    """The fleet's lookup is load()'s: a name with a planted ./linux/proxy in the cwd ships nothing
    (the hosts use their own catalog); an explicit, trusted file travels in the bundle."""
    from proxytune.tune import fleet as fleet_mod
    plant(nobody_dir)
    cwd = nobody_dir if bundled is None else tmp_path
    (tmp_path / "mine.toml").write_text(GOOD.format(what="mine", include=""))
    (tmp_path / "inv.ini").write_text("h1\n")
    seen = {}

    def bundle(dest, profile_file=None):
        seen["f"], seen["text"] = profile_file, profile_file and profile_file.read_text()
        return dest / "bundle.tar", "digest"
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(fleet_mod.inv, "hosts", lambda *a: ["h1"])       # no ansible-inventory needed
    monkeypatch.setattr(fleet_mod.fp, "bundle", bundle)
    (tmp_path / "work").mkdir()                 # a given workdir exists, as a run's own rundir does
    fl = fleet_mod.Fleet(str(tmp_path / "inv.ini"), ref, workdir=tmp_path / "work")
    fl.prepare()
    assert (seen["f"] and seen["f"].name) == bundled and fl.shipped_profile == (bundled is not None)
    if bundled:                 # the file travels flattened as resolved here (issue 27, item 2), not by its name
        assert f"as resolved from {tmp_path / 'mine.toml'}" in seen["text"]


@needs_root
def test_a_profile_path_with_a_newline_cannot_add_a_line_to_an_export(tmp_path, sandbox):
    """The reference is printed in every export's header comment: a newline in it would start a sysctl line."""
    d = tmp_path / "a\nkernel.core_pattern = |"
    d.mkdir()
    (d / "p.toml").write_text(GOOD.format(what="x", include=""))
    r = run("tune", "export", "--format", "sysctl.d", "-p", str(d / "p.toml"))
    assert r.returncode == 2 and "control character" in r.stderr and "core_pattern" not in r.stdout
    assert len(r.stderr.strip().splitlines()) == 2, r.stderr        # the line and its hint


# ------------------------------------------- exports: a payload in the profile's own file name

@pytest.mark.parametrize("name", ["{{ lookup('pipe','id') }} proxytune-service-var.toml",
                                  "{% if lookup('pipe','id') %}{% endif %} proxytune-user-var.toml"])
def test_a_profile_file_name_that_would_be_templated_is_refused(tmp_path, sandbox, name):
    """The reference goes into the playbook's play name. Alone it is tagged !unsafe, but with the
    detected-service stand-in in it too, the scalar was untagged to take `{{ proxytune_service }}`:
    the lookup became live Jinja in the play name. A reference with evaluable text is refused."""
    prof = tmp_path / name
    prof.write_text(GOOD.format(what="d", include=""))
    r = run("tune", "export", "--format", "ansible", "-p", f"./{name}", cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert "lookup" not in r.stdout and "would evaluate" in r.stderr and len(r.stderr.splitlines()) <= 2
