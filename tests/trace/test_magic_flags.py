"""The profiling and strict-mode flags through the real %%neuron magic (wired by the magic layer)."""

import pytest
from IPython.core.error import UsageError
from trace_model import CELL, EXPECTED_FALLBACKS, PoolNet

from neuron_workbench.testing import run_cell


@pytest.fixture
def shell(ip):
    import torch

    torch.manual_seed(0)
    ip.user_ns.update(torch=torch, PoolNet=PoolNet, images=torch.randn(2, 3, 16, 16))
    return ip


def test_strict_fails_the_cell_naming_every_fallback_op(shell):
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("neuron", "--no-scan --strict -o report", CELL)
    ops = sorted(EXPECTED_FALLBACKS)
    assert str(info.value) == (
        f"strict mode: 3 ops fell back to CPU on neuron: {', '.join(ops)} "
        f"(allow them with --allow-fallback {','.join(ops)})"
    )
    assert shell.user_ns["report"].target.fallback_ops() == ops  # the report is still stored


def test_allow_fallback_exempts_ops_in_either_spelling(shell):
    allowed = "sort,aten::max_pool2d_with_indices,max_pool2d_with_indices_backward"
    shell.run_cell_magic("neuron", f"--no-scan --strict --allow-fallback {allowed} -o report", CELL)
    assert bool(shell.user_ns["report"])
    with pytest.raises(
        UsageError, match=r"^strict mode: 1 op fell back to CPU on neuron: aten::sort "
    ):
        shell.run_cell_magic(
            "neuron",
            "--no-scan --strict --allow-fallback "
            "aten::max_pool2d_with_indices,aten::max_pool2d_with_indices_backward",
            CELL,
        )


def test_plain_magic_records_no_profile(shell):
    run_cell(shell, "%%neuron --no-scan -o report\n" + CELL)
    data = shell.user_ns["report"].to_dict()
    assert "profile" not in data["ref"] and "profile" not in data["target"]


def test_profile_flag_embeds_both_profiles_in_the_report(shell):
    run_cell(shell, "%%neuron --no-scan --profile -o report\n" + CELL)
    data = shell.user_ns["report"].to_dict()
    ref, target = data["ref"]["profile"], data["target"]["profile"]
    assert (ref["backend"], ref["time_kind"]) == ("cpu", "wall time")
    assert (target["backend"], target["time_kind"]) == ("neuron", "host CPU time")
    for profile in (ref, target):
        calls = {row["op"]: row["calls"] for row in profile["rows"]}
        assert calls["aten::sort"] == 3 and calls["aten::convolution"] == 2
        assert all(
            row["self_time_s"] >= 0 and row["bytes_allocated"] >= 0 for row in profile["rows"]
        )
    assert target["peak_memory_bytes"] > 0


def test_repeat_separates_the_first_call_from_steady_state(shell):
    run_cell(shell, "%%neuron --no-scan --profile --steps 3 -o report\n" + CELL)
    target = shell.user_ns["report"].to_dict()["target"]["profile"]
    assert target["steps"] == 3 and len(target["step_times_s"]) == 3
    first = {row["op"]: row["calls"] for row in target["first_call"]}
    steady = {row["op"]: row["calls"] for row in target["steady"]}
    assert first["aten::sort"] == 3 and steady["aten::sort"] == 6
    assert first["aten::convolution"] == 2 and steady["aten::convolution"] == 4
