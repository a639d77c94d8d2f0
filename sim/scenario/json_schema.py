"""The JSON Schema of the scenario YAML format, from the same pydantic models the loader uses
(`clustersim schema`, editors; tests/sim/scenario/test_json_schema.py holds it to the loader)."""

from __future__ import annotations

from typing import Any

from clustersim.sim.scenario.schema import Scenario


def scenario_json_schema() -> dict[str, Any]:
    """JSON schema of the YAML format (YAML key names), for `clustersim schema` and editors: the
    Scenario model's, plus the optional `variants` list a file for `clustersim compare` may hold
    (sim.scenario.loader.load_variants_text reads it; each variant's overrides are validated as
    the scenario they make)."""
    schema = Scenario.model_json_schema()
    schema["properties"]["variants"] = {
        "type": "array",
        "minItems": 1,
        "description": "variants of this scenario for `clustersim compare`: a name and dotted-path overrides",
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
            "additionalProperties": True,
        },
    }
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
