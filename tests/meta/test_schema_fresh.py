"""docs/cert.schema.json must be exactly what the pydantic model generates."""

from __future__ import annotations

import json

from batch_invariance.cert.schema import cert_to_json, schema_text
from tests.support.factories import cert_for, green_evidence
from tests.support.paths import REPO

SCHEMA = REPO / "docs" / "cert.schema.json"


def test_schema_file_is_fresh() -> None:
    assert SCHEMA.exists(), (
        "run: python -m batch_invariance.commands.write_schema --write-schema " + str(SCHEMA)
    )
    assert SCHEMA.read_text(encoding="utf-8") == schema_text(), (
        "docs/cert.schema.json is stale; regenerate it with "
        "`python -m batch_invariance.commands.write_schema --write-schema docs/cert.schema.json`"
    )


def test_schema_names_every_top_level_field_as_required() -> None:
    schema = json.loads(schema_text())
    cert = cert_to_json(cert_for()[0])
    # `prompt_cache` is absent from a cert that did not measure the prompt cache (this one),
    # `sequence_scope` from one that records no slot (as before the scope rule).
    assert "prompt_cache" not in cert and "sequence_scope" not in cert
    assert set(schema["properties"]) == set(cert) | {"prompt_cache", "sequence_scope"}
    scoped = cert_to_json(cert_for(green_evidence(slot_ctx=2048))[0])
    assert set(scoped) == set(cert) | {"sequence_scope"}
    assert scoped["evidence"]["slot_ctx"] == 2048
    # `throughput`, `prompt_cache`, `sequence_scope` and `rules_version` are optional: absent
    # (never null) in a cert written without per-arm timings, without the cache arm, before
    # the scope rule or before the rules were versioned, so such certs keep their digest. A
    # new cert always records its rules.
    assert "rules_version" in cert
    assert set(schema["required"]) == set(cert) - {"throughput", "rules_version"}
    assert schema.get("additionalProperties") is False


def test_output_contract_doc_mentions_every_field() -> None:
    doc = (SCHEMA.parent / "output-contract.md").read_text(encoding="utf-8")
    cert = cert_to_json(cert_for(green_evidence(slot_ctx=2048))[0])
    missing = [k for k in cert if f"`{k}`" not in doc]
    assert not missing, f"docs/output-contract.md does not document {missing}"
