"""The registry: rules come from the rule areas, one id each, with consistent data."""

from pathlib import Path

import pytest

from neuron_workbench.scan import RULES, get_rule
from neuron_workbench.scan.checks import AREAS
from neuron_workbench.scan.checks.base import Area
from neuron_workbench.scan.rules import _collect

CHECK_TESTS = Path(__file__).parent / "checks"


def test_registry_is_the_rules_of_every_area_in_id_order():
    declared = [rule.id for area in AREAS for rule in area.rules]
    assert sorted(declared) == list(RULES)  # each id declared once, listed in id order
    assert len(RULES) == 30


def test_every_area_has_its_test_module():
    # Adding a rule touches its area's module and that module's test (which covers every rule
    # of the area with positive and look-alike snippets).
    for area in AREAS:
        assert (CHECK_TESTS / f"test_{area.name}.py").is_file(), area.name


def test_a_rule_declared_twice_is_refused():
    twice = (Area("a", (RULES["NW101"],)), Area("b", (RULES["NW101"],)))
    with pytest.raises(RuntimeError, match="NW101 is declared twice"):
        _collect(twice)


def test_registry_is_consistent():
    for rule_id, rule in RULES.items():
        assert rule.id == rule_id and rule_id.startswith("NW") and len(rule_id) == 5
        assert rule.severity in ("info", "warning", "error")
        assert "shared/notes/" in rule.source, rule_id  # every rule names its vendor fact
        assert rule.message and rule.suggestion
    assert get_rule("NW101").fixable
    assert {r.id for r in RULES.values() if r.fixable} == {
        "NW101",
        "NW102",
        "NW103",
        "NW106",
        "NW110",
        "NW113",
    }
    # Severities encode "will not run" vs "runs but differs" vs "rename".
    assert {r.id for r in RULES.values() if r.severity == "error"} >= {
        "NW140",
        "NW151",
        "NW160",
        "NW161",
        "NW170",
        "NW190",
    }
