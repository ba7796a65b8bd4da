"""Tolerance tables and the dtype names reports carry (:mod:`neuron_workbench.compare.tolerances`)."""

import torch

from neuron_workbench.compare.tolerances import default_tolerance, dtype_named


def test_a_reports_dtype_name_is_the_dtype_and_anything_else_is_none():
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        assert dtype_named(str(dtype).removeprefix("torch.")) is dtype
    # not a dtype: a function, a module, a name this torch lacks, nothing
    for name in ("ones", "cuda", "float1024", "", None):
        assert dtype_named(name) is None


def test_the_default_tolerance_is_the_loosest_of_the_dtypes():
    loose, tight = default_tolerance(torch.bfloat16), default_tolerance(torch.float32)
    assert loose.rtol > tight.rtol
    assert default_tolerance(torch.float32, torch.bfloat16) == loose
    assert default_tolerance(torch.int64) == default_tolerance() == default_tolerance(None)
    assert default_tolerance(torch.int64).rtol == 0
