"""One schema for every result proxytune writes (audit, apply, bench, probe).

The envelope is fixed; `data` belongs to the kind. Readers (report,
report compare) validate before they trust a file.
"""

import time

import jsonschema

from .fingerprint import fingerprint

SCHEMA_ID = "proxytune.result/1"
KINDS = ("audit", "plan", "apply", "rollback", "bench", "probe", "report")

FINGERPRINT = {
    "type": "object",
    "required": ["hostname", "os", "kernel", "cpu_model", "cores", "virtualised", "filesystems"],
    "properties": {
        "hostname": {"type": "string"}, "os": {"type": "string"}, "kernel": {"type": "string"},
        "cpu_model": {"type": "string"}, "cores": {"type": ["integer", "null"]},
        "virtualised": {"type": "string"}, "filesystems": {"type": "array"},
    },
}

AUDIT_DATA = {
    "type": "object",
    "required": ["profile", "settings", "summary"],
    "properties": {
        "settings": {"type": "array", "items": {
            "type": "object",
            "required": ["setting", "current", "wanted", "mode", "status", "reason", "source"],
            "properties": {"status": {"enum": ["met", "drift", "n/a", "error"]}},
        }},
        "summary": {"type": "object"},
    },
}

RESULT = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema", "kind", "created", "host", "data"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "kind": {"enum": list(KINDS)},
        "created": {"type": "string"},
        "host": FINGERPRINT,
        "data": {"type": "object"},
    },
    "allOf": [{"if": {"properties": {"kind": {"const": "audit"}}},
               "then": {"properties": {"data": AUDIT_DATA}}}],
}


def envelope(kind: str, data: dict, paths: list[str] | None = None) -> dict:
    doc = {"schema": SCHEMA_ID, "kind": kind,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "host": fingerprint(paths), "data": data}
    validate(doc)
    return doc


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError when a result does not fit the schema."""
    jsonschema.validate(doc, RESULT)
