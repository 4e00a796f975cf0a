"""One schema for every result proxytune writes (audit, apply, bench, probe).

The envelope is fixed; `data` belongs to the kind. Readers (report,
report compare) validate before they trust a file.
"""

import time

import jsonschema

from .fingerprint import fingerprint

SCHEMA_ID = "proxytune.result/1"
KINDS = ("audit", "plan", "apply", "rollback", "status", "bench", "probe", "report", "fleet")

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
            "properties": {"status": {"enum": ["met", "drift", "n/a", "error", "waived"]}},
        }},
        "summary": {"type": "object"},
    },
}

STAT = {"type": "object", "required": ["median", "min", "max", "n", "iqr_rel", "ci95"],
        "properties": {"median": {"type": "number"}, "n": {"type": "integer", "minimum": 1}}}

EVENTS_DATA = {
    "type": "object",
    "required": ["bench", "quick", "backends", "idle", "churn", "load", "libevent", "scaling"],
    "properties": {
        "bench": {"const": "events"},
        "backends": {"type": "array", "items": {"type": "object", "required": ["name", "available", "reason"]}},
        "idle": {"type": "array", "items": {
            "type": "object", "required": ["backend", "n", "k", "ready", "available"],
            "if": {"properties": {"available": {"const": True}}},
            "then": {"required": ["ns_per_call", "events_per_call", "noisy", "command"],
                     "properties": {"ns_per_call": STAT}},
            "else": {"required": ["reason"]}}},
    },
}

FDSCAN_DATA = {
    "type": "object",
    "required": ["bench", "points", "misses", "miss_source"],
    "properties": {
        "bench": {"const": "fdscan"},
        "points": {"type": "array", "items": {"type": "object", "required": ["variant", "n", "ns_per_call"],
                                                 "properties": {"variant": {"enum": [1, 2, 3, 4, 5]},
                                                                "ns_per_call": STAT}}},
    },
}

FLEET_DATA = {
    "type": "object",
    "required": ["fleet", "profile", "hosts", "summary", "exit"],
    "properties": {
        "hosts": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["status", "fingerprint", "settings"],
            "properties": {"status": {"enum": ["ok", "unreachable", "failed", "skipped"]},
                           "fingerprint": {"anyOf": [{"type": "null"}, FINGERPRINT]},
                           "summary": {"type": "object"}, "error": {"type": "string"},
                           "capabilities": {"type": "object"},
                           "settings": {"type": "array", "items": {
                               "type": "object", "required": ["setting", "status", "current_text", "wanted_text"],
                               "properties": {"setting": {"type": "string"}, "current_text": {"type": "string"},
                                              "wanted_text": {"type": "string"}}}}}}},
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
               "then": {"properties": {"data": AUDIT_DATA}}},
              {"if": {"properties": {"kind": {"const": "fleet"}}},
               "then": {"properties": {"data": FLEET_DATA}}},
              {"if": {"properties": {"kind": {"const": "bench"}, "data": {"properties": {"bench": {"const": "events"}}}}},
               "then": {"properties": {"data": EVENTS_DATA}}},
              {"if": {"properties": {"kind": {"const": "bench"}, "data": {"properties": {"bench": {"const": "fdscan"}}}}},
               "then": {"properties": {"data": FDSCAN_DATA}}}],
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
