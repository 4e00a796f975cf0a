"""One schema for every result proxytune writes (audit, apply, bench, probe, ...).

The envelope is fixed; `data` belongs to the kind. The schema is a JSON
Schema file shipped in the package (schemas/result.json), so that what
`proxytune schema` publishes and what readers (report, report compare)
validate against before they trust a file are one and the same.
"""

import copy
import time

from proxytune.core.errors import ProxytuneError
from proxytune.core.resultschema import SCHEMA_FILE, SCHEMA_ID, result_schema, validate  # noqa: F401

from .fingerprint import fingerprint


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
