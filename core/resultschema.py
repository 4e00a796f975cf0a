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


@cache
def _validator():
    """Built once, without jsonschema.validate's check of the schema itself against its metaschema on
    every call: that check was 99 % of a doctor result's validation (0.13 s of 0.13 s idle, 1.5 s on a
    loaded 2-core host). tests/test_output.py checks the shipped schema once."""
    schema = result_schema()
    return jsonschema.validators.validator_for(schema)(schema)


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError when a result does not fit the schema (the error
    jsonschema.validate would raise: the best match)."""
    error = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if error is not None:
        raise error
