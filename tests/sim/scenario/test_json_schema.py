"""Schema = loader: the JSON Schema `clustersim schema` prints accepts every bundled scenario (and
the README's example), and rejects what the loader rejects for its keys (issue 16, acceptance 4)."""

import re

import jsonschema
import pytest
import yaml

from clustersim.sim.scenario.json_schema import scenario_json_schema
from clustersim.sim.scenario.loader import load_scenario_text, load_scenarios
from clustersim.sim.scenario.schema import ScenarioError

from repo import ROOT, SCENARIOS

BUNDLED = sorted(SCENARIOS.rglob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = scenario_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_every_bundled_scenario_validates_against_the_schema(validator, path):
    assert load_scenarios(path)  # the loader takes it
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert not errors, errors


def test_the_readmes_scenario_block_loads_and_validates(validator):
    """The README's commented example of the format is a scenario the loader and schema accept."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## The scenario format\s+```yaml\n(.*?)```", readme, re.S)
    assert block, "README has no ```yaml block under '## The scenario format'"
    load_scenario_text(block.group(1), "README.md")
    assert not [e.message for e in validator.iter_errors(yaml.safe_load(block.group(1)))]


@pytest.mark.parametrize(
    ("where", "key"),
    [((), "colour"), (("cluster",), "racks"), (("cluster", "topology"), "wrap"), (("parallel",), "pipeline")],
)
def test_a_key_the_loader_rejects_the_schema_rejects_too(validator, where, key):
    text = (SCENARIOS / "quickstart.yaml").read_text()
    data = yaml.safe_load(text)
    node = data
    for part in where:
        node = node[part]
    node[key] = 1  # unknown here (a switch has no `wrap`)
    with pytest.raises(ScenarioError, match=re.escape(".".join((*where, key)))):
        load_scenario_text(yaml.safe_dump(data), "q.yaml")
    assert list(validator.iter_errors(data)), f"the schema accepts {'.'.join((*where, key))}"
