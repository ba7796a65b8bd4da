"""Core messages name options by API name; both front ends spell them as the same flags."""

import pytest

from neuron_workbench.cell.settings import CompareOptions
from neuron_workbench.compare.tolerances import check_pair, parse_override
from neuron_workbench.errors import OptionError, WorkbenchUsageError
from neuron_workbench.magics.flags import flag, usage_message


def test_flags_of_api_option_names():
    assert [flag(n) for n in ("rtol", "ref_precision", "per_output", "steps")] == [
        "--rtol",
        "--ref-precision",
        "--tol",
        "--steps",
    ]


@pytest.mark.parametrize(
    ("bad", "core", "front_end"),
    [
        (lambda: check_pair(1e-3, None), "give rtol and atol together", "give --rtol and --atol"),
        (lambda: parse_override("x=1"), "per_output expects PATH", "--tol expects PATH"),
        (lambda: CompareOptions(keep="both").validate(), "keep must be one of ref, target",
         "--keep must be one of ref, target"),
        (lambda: CompareOptions(what_if="fp8").validate(), "what_if must be one of bf16-matmul",
         "--what-if must be one of bf16-matmul"),
    ],
)  # fmt: skip
def test_core_messages_speak_in_option_terms(bad, core, front_end):
    with pytest.raises(OptionError) as info:
        bad()
    assert str(info.value).startswith(core)
    assert "--" not in str(info.value)
    assert usage_message(info.value).startswith(front_end)


def test_user_text_with_braces_is_kept_as_written():
    with pytest.raises(OptionError) as info:
        parse_override("{a}=1")
    assert usage_message(info.value) == "--tol expects PATH=RTOL,ATOL, got '{a}=1'"


def test_other_usage_errors_pass_through():
    assert usage_message(WorkbenchUsageError("no such file")) == "no such file"
