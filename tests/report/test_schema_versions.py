"""Report data of the previous schema version (1) is still read: fixtures/report_v1.json was written
by the code before ``steps`` became the one name of the op profile's step count."""

import copy
import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.report import SCHEMA_VERSION, read_report, render_report_html
from neuron_workbench.trace.profile_data import OpProfile
from neuron_workbench.views.tables import ops_html

FIXTURE = Path(__file__).parent / "fixtures" / "report_v1.json"


@pytest.fixture(scope="module")
def v1():
    return json.loads(FIXTURE.read_text())


def validator():
    text = resources.files("neuron_workbench.report").joinpath("report.schema.json").read_text()
    return jsonschema.Draft202012Validator(json.loads(text))


def test_the_fixture_is_version_1_with_the_old_profile_keys(v1):
    assert v1["schema_version"] == 1 and SCHEMA_VERSION == 3
    assert v1["target"]["profile"]["iterations"] == 2 and v1["options"]["steps"] == 2


def test_read_report_brings_version_1_to_the_current_schema(v1):
    before = copy.deepcopy(v1)
    data = read_report(v1)
    assert v1 == before  # the input is not changed
    assert data["schema_version"] == SCHEMA_VERSION
    for role in ("ref", "target"):
        profile = data[role]["profile"]
        assert profile["steps"] == 2 and len(profile["step_times_s"]) == 2
        assert "iterations" not in profile and "iteration_times_s" not in profile
    assert data["outputs"] == v1["outputs"] and data["layers"] == v1["layers"]
    validator().validate(data)


@pytest.mark.parametrize("version", [1, 2])
def test_reports_before_version_3_read_as_measuring_no_budget(v1, version):
    old = {**read_report(v1), "schema_version": version}
    old.pop("budget")
    data = read_report(old)
    assert data["budget"] is None and data["schema_version"] == 3
    validator().validate(data)
    assert "Precision budget" not in render_report_html(data)


def test_current_data_passes_through_unchanged(v1):
    data = read_report(v1)
    assert read_report(data) == data


def test_a_newer_version_is_refused_with_a_clear_message(v1):
    with pytest.raises(WorkbenchUsageError, match="schema_version 99 .* upgrade neuron-workbench"):
        read_report({**v1, "schema_version": 99})


def test_renderers_read_version_1_data(v1):
    assert "neuron" in render_report_html(v1)
    assert "2 steps: first call" in ops_html(read_report(v1))


def test_op_profile_from_dict_reads_the_old_keys(v1):
    profile = OpProfile.from_dict(v1["target"]["profile"])
    assert profile.steps == 2 and len(profile.step_times_s) == 2
    assert profile.to_dict()["steps"] == 2 and "iterations" not in profile.to_dict()


def test_version_1_runs_get_the_label_their_backend_gives(v1):
    data = read_report(v1)
    assert (data["ref"]["label"], data["target"]["label"]) == ("cpu (as cuda)", "neuron (emulated)")
    assert "label" not in v1["ref"]
