"""Second attack round on issue 20: variants not used while building the fix.

Each test is a local user (`nobody`, via setpriv or files it owns) against root
running proxytune, or a tired operator's environment (`sudo -E` keeps PROXYTUNE_*).
"""

import subprocess

import pytest

from conftest import needs_root
from test_adversarial_engine import prof  # noqa: F401
from test_adversarial_profiles import AS_NOBODY, nobody_dir  # noqa: F401

# ------------------------------------------- host lock / state dir inside a directory another user owns

@needs_root
@pytest.mark.parametrize("var", ["PROXYTUNE_LOCK_DIR", "PROXYTUNE_STATE_DIR"])
def test_a_lock_or_state_dir_whose_parent_another_user_owns_is_refused(sandbox, prof, cli, nobody_dir, monkeypatch,
                                                                      var):
    """`sudo -E` with PROXYTUNE_LOCK_DIR (or STATE_DIR) under a directory nobody owns: root made the
    directory itself (0700, its own), but nobody can rename it away at any time and let a second
    apply take a fresh lock (two writers at once) or make rollback find no journal. Refused."""
    target = nobody_dir / "pt"
    monkeypatch.setenv(var, str(target))
    r = cli("tune", "apply", "-p", str(prof), "--service", "squid", "--yes")
    assert r.exit_code == 2, r.output
    assert "uid 65534" in r.output and "Traceback" not in r.output
    assert not target.exists()
    assert not (sandbox.root / "etc/security/limits.d").exists()
    # nobody can indeed move what root would have made there: the threat is real
    subprocess.run(AS_NOBODY + ["mkdir", str(target)], check=True)
    subprocess.run(AS_NOBODY + ["mv", str(target), str(nobody_dir / "moved")], check=True)


# ------------------------------------------- fleet: hostile JSON shapes that pass (or break) the parser

def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["whole", "current"])
def test_a_host_answer_nested_too_deeply_is_a_failed_host(where):
    """A host prints 100000 nested arrays (json.loads raised RecursionError: the fleet crashed), or a
    schema-valid audit whose setting's free-form `current` is 950 levels deep (it parses, but any later
    json.dumps or render of the host rows from a few frames deeper recurses past Python's limit)."""
    import json
    from test_adversarial_fleet import AUDIT, SETTING, envelope, run_event
    from proxytune.tune import fleet_play as fp, fleet_result
    deep = json.loads(_nested(950))
    if where == "whole":
        stdout = _nested(100000)
    else:
        stdout = envelope("audit", {**AUDIT, "settings": [{**SETTING, "current": deep}]})
    r = fleet_result.host_result([run_event(stdout)], fp.RUN_TASK, "audit")
    assert r["status"] == "failed" and "nested too deeply" in r["error"], r["error"]
    assert r["doc"] is None and r["settings"] == []

    def deeper(n):      # what a renderer 60 frames down would have met, had the document passed
        return deeper(n - 1) if n else json.dumps(deep)
    with pytest.raises(RecursionError):
        deeper(60)


def test_a_host_answering_json_null_is_not_called_too_deep():
    from test_adversarial_fleet import run_event
    from proxytune.tune import fleet_play as fp, fleet_result
    r = fleet_result.host_result([run_event("null")], fp.RUN_TASK, "audit")
    assert r["status"] == "failed" and "does not fit the schema" in r["error"], r["error"]


# ------------------------------------------- exports: a payload in the profile's own file name

@pytest.mark.parametrize("name", ["{{ lookup('pipe','id') }} proxytune-service-var.toml",
                                  "{% if lookup('pipe','id') %}{% endif %} proxytune-user-var.toml"])
def test_a_profile_file_name_that_would_be_templated_is_refused(tmp_path, sandbox, name):
    """The reference goes into the playbook's play name. Alone it is tagged !unsafe, but with the
    detected-service stand-in in it too, the scalar was untagged to take `{{ proxytune_service }}`:
    the lookup became live Jinja in the play name. A reference with evaluable text is refused."""
    from test_adversarial_profiles import GOOD, run
    prof = tmp_path / name
    prof.write_text(GOOD.format(what="d", include=""))
    r = run("tune", "export", "--format", "ansible", "-p", f"./{name}", cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert "lookup" not in r.stdout and "would evaluate" in r.stderr and len(r.stderr.splitlines()) <= 2
