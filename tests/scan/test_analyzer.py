"""The walk: hooks run in ``AREAS`` order, so an area's own device check wins over the generic one."""

import ast

import pytest

from neuron_workbench.scan.analyzer import analyze
from neuron_workbench.scan.checks import AREAS


def found(source):
    return [(f.rule_id, f.line, f.col, f.message) for f, _ in analyze(ast.parse(source), source)]


def test_autocast_and_gradscaler_report_their_own_device_argument():
    autocast = (
        'import torch\nwith torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n    pass'
    )
    assert found(autocast) == [("NW110", 2, 33, 'autocast on device type "cuda"')]
    scaler = 'import torch\ns = torch.amp.GradScaler(device="cuda")'
    assert found(scaler) == [("NW113", 2, 33, 'GradScaler for device "cuda"')]


def test_generator_device_is_not_also_a_device_string_finding():
    source = 'import torch\ng = torch.Generator(device="cuda")'
    assert found(source) == [("NW190", 2, 5, "`torch.Generator` on a CUDA device")]


def test_environment_variable_entry_is_not_a_device_entry():
    source = 'env = {"CUDA_VISIBLE_DEVICES": "cuda"}'
    assert found(source) == [
        ("NW130", 1, 8, "`CUDA_VISIBLE_DEVICES` is ignored by the neuron runtime")
    ]


def test_first_argument_of_a_device_call_is_reported_once_without_keyword_wording():
    source = (
        'import torch\nm = torch.distributed.init_device_mesh(device_type="cuda", mesh_shape=(2,))'
    )
    assert found(source) == [("NW101", 2, 52, 'device string "cuda" names a CUDA GPU')]


def test_devices_area_runs_last_and_env_before_it():
    names = [area.name for area in AREAS]
    assert names[-1] == "devices"
    assert names.index("env") < names.index("devices")


def test_unknown_target_is_a_value_error():
    with pytest.raises(ValueError, match="unknown target 'gpu'; expected one of neuron, tpu"):
        analyze(ast.parse("x = 1"), "x = 1", target="gpu")
