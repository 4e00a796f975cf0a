"""One schema for every result proxytune writes (audit, apply, bench, probe, ...).

The envelope is fixed; `data` belongs to the kind. The schema is a JSON
Schema file shipped in the package (schemas/result.json), so that what
`proxytune schema` publishes and what readers (report, report compare)
validate against before they trust a file are one and the same.
"""

import copy
import json
import time
from functools import cache
from pathlib import Path

import jsonschema

from proxytune.core.errors import ProxytuneError

from .fingerprint import fingerprint

SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "result.json"
SCHEMA_ID = "proxytune.result/1"


@cache
def result_schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def kinds() -> list[str]:
    return list(result_schema()["properties"]["kind"]["enum"])


def kind_schema(kind: str | None = None) -> dict:
    """The whole result schema, or the schema of one kind's results (its envelope with kind fixed,
    and only the rules for its data)."""
    doc = copy.deepcopy(result_schema())
    if kind is None:
        return doc
    if kind not in kinds():
        raise ProxytuneError(f"no result kind {kind!r}", "one of: " + ", ".join(kinds()))
    doc["title"] = f"proxytune {kind} result"
    doc["properties"]["kind"] = {"const": kind, "description": doc["properties"]["kind"]["description"]}
    rules = [rule for rule in doc.pop("allOf") if rule["if"]["properties"]["kind"]["const"] == kind]
    return {**doc, "allOf": rules} if rules else doc


def envelope(kind: str, data: dict, paths: list[str] | None = None) -> dict:
    doc = {"schema": SCHEMA_ID, "kind": kind,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "host": fingerprint(paths), "data": data}
    validate(doc)
    return doc


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError when a result does not fit the schema."""
    jsonschema.validate(doc, result_schema())
