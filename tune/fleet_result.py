"""What one fleet host answered, read as untrusted input.

Each host's Ansible events become one status (ok / unreachable / failed /
skipped) and, when ok, the proxytune document it printed. That document is
validated against the result schema and against the shape of every field the
fleet reads (journal id, steps, settings, summary) before anything uses it: a
document that does not fit fails its host with one line, it never crashes the
fleet and never counts as ok.
"""

import json

import jsonschema

from proxytune.core.errors import one_line
from proxytune.core import resultschema as schema

OK, UNREACHABLE, FAILED, SKIPPED = "ok", "unreachable", "failed", "skipped"
MAX_DEPTH = 64                 # a result nests 5 or 6 levels; json.dumps and the renderers recurse
TOO_DEEP = f"the host's answer is nested too deeply (more than {MAX_DEPTH} levels)"
COUNT = {"type": "integer", "minimum": 0}
SETTINGS = {"type": "array", "items": {
    "type": "object", "required": ["setting", "status", "current_text", "wanted_text"],
    "properties": {"setting": {"type": "string"}, "current_text": {"type": "string"},
                   "wanted_text": {"type": "string"}, "status": {"enum": ["met", "drift", "n/a", "error", "waived"]}}}}
AUDIT = {"type": "object", "required": ["settings", "summary"],
         "properties": {"settings": SETTINGS, "summary": {
             "type": "object", "required": ["met", "drift", "n/a", "error"],
             "properties": {k: COUNT for k in ("met", "drift", "n/a", "error")}}}}
JOURNAL_ID_RE = r"^[0-9A-Za-z][0-9A-Za-z_.:-]{0,99}$"      # passed on as `--id ID`: never an option or a template
JOURNAL_ID = {"type": ["string", "null"], "pattern": JOURNAL_ID_RE}
# what the fleet reads of each kind's data, on top of the result schema
DATA = {
    "audit": AUDIT,
    "plan": AUDIT,
    "apply": {"type": "object", "required": ["journal", "steps"],
              "properties": {"journal": JOURNAL_ID, "steps": {"type": "array"}, "verify": AUDIT}},
    "rollback": {"type": "object", "required": ["journal", "steps", "failures"],
                 "properties": {"journal": JOURNAL_ID, "steps": {"type": "array"}, "failures": {"type": "array"}}},
}
CAPS = {"type": "object", "required": ["capabilities"],
        "properties": {"capabilities": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}}}}


def first_line(text) -> str:
    """The last line of a host's message, control characters written as escapes (it reaches a terminal)."""
    lines = str(text or "").strip().splitlines()
    return one_line(lines[-1][:200]) if lines else ""


def failure(ev: dict) -> str:
    """Why a task failed, in one line: its stderr or Ansible's message; a timeout (exit 124 from
    `timeout` on the host, or Ansible's task timeout) says so."""
    why = first_line(ev.get("stderr") or ev.get("msg"))
    if ev.get("rc") == 124 or "expected time frame" in why:
        return "no answer within --timeout; stopped there"
    return why


def empty() -> dict:
    return {"status": SKIPPED, "fingerprint": None, "settings": [], "summary": {}, "exit": None, "error": "",
            "doc": None}


def host_result(events: list[dict], task: str, kind: str) -> dict:
    """One host's status and its checked proxytune document (`kind`: the result kind the
    task prints, or "caps" for `probe caps --json`)."""
    out = empty()
    for ev in events:
        if ev.get("event") == UNREACHABLE:
            return {**out, "status": UNREACHABLE, "error": first_line(ev.get("msg"))}
        if ev.get("event") == FAILED and ev.get("task") != task:
            return {**out, "status": FAILED, "error": f"{ev.get('task')}: {failure(ev)}"}
        if ev.get("task") == task and ev.get("event") in (OK, FAILED):
            out.update(parse_run(ev, kind))
    return out


def parse_run(ev: dict, kind: str) -> dict:
    """The host's status from its run task's event: ok only when the task succeeded and its
    document fits."""
    doc, why = checked_document(ev.get("stdout"), kind)
    rc = ev.get("rc") if isinstance(ev.get("rc"), int) else None
    if ev.get("event") == FAILED:
        error = failure(ev) or (f"exit {rc}" if doc else why)
        return {"status": FAILED, "exit": rc, "error": error, "doc": doc, **_rows(doc, kind)}
    if doc is None:
        return {"status": FAILED, "exit": rc, "error": why, "doc": None}
    return {"status": OK, "exit": rc, "error": "", "doc": doc, **_rows(doc, kind)}


def checked_document(stdout, kind: str) -> tuple[dict | None, str]:
    """(the document, "") when it fits, else (None, one line saying why)."""
    try:
        doc = json.loads(stdout or "")
    except (TypeError, ValueError):
        return None, "the host's answer is not a JSON document"
    except RecursionError:
        return None, TOO_DEEP
    if _depth(doc) > MAX_DEPTH:
        return None, TOO_DEEP
    try:
        schema.validate(doc)
        if kind == "caps":                  # `probe caps --json`: a probe result whose data is the capabilities
            jsonschema.validate(doc, {"type": "object", "properties": {"kind": {"const": "probe"}, "data": CAPS}})
            return doc, ""
        if doc["kind"] != kind:
            return None, f"the host answered with its {doc['kind']} result where its {kind} result was due"
        jsonschema.validate(doc, {"type": "object", "properties": {"data": DATA[kind]}})
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "the document"
        return None, f"the host's result does not fit the schema at {where}: {one_line(e.message[:120])}"
    return doc, ""


def _depth(doc) -> int:
    """How deeply lists and objects nest in doc, counted without recursion."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, level = todo.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            todo += [(child, level + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def _rows(doc: dict | None, kind: str) -> dict:
    """Settings and summary of a checked document (an apply's are those of its verify)."""
    if doc is None or kind == "caps":
        return {}
    data = doc["data"].get("verify", doc["data"]) if kind == "apply" else doc["data"]
    out = {"fingerprint": doc["host"]}
    if "settings" in data:
        out.update(settings=data["settings"], summary=data["summary"])
    return out


def journal_of(doc: dict | None) -> str | None:
    """The journal entry id of a checked apply or rollback document."""
    return doc["data"]["journal"] if doc else None
