"""The result schema file (reports/schemas/result.json, shipped beside the code) and its check.

Every layer validates against it: reports before they trust a result file, the fleet before
it trusts a host's answer. It lives here, below them all, so that tune/ and probes/ need not
import reports/ (which sits on top of them)."""

import json
from functools import cache
from pathlib import Path

import jsonschema

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "reports" / "schemas" / "result.json"
SCHEMA_ID = "proxytune.result/1"


@cache
def result_schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError when a result does not fit the schema."""
    jsonschema.validate(doc, result_schema())
