"""The tpu adapter's options and its capture of TorchTPU's per-call fallback warnings."""

from __future__ import annotations

import os

import pytest

from neuron_workbench.backends import get_backend
from neuron_workbench.backends.tpu import LIST_FALLBACKS_ENV, StderrWarnings
from neuron_workbench.errors import WorkbenchUsageError


def test_full_list_is_an_option_or_the_environment(monkeypatch):
    monkeypatch.delenv(LIST_FALLBACKS_ENV, raising=False)
    assert get_backend("tpu").list_fallbacks is False
    assert get_backend("tpu", list_fallbacks=True).list_fallbacks is True
    monkeypatch.setenv(LIST_FALLBACKS_ENV, "1")
    assert get_backend("tpu").list_fallbacks is True
    assert get_backend("tpu", list_fallbacks=False).list_fallbacks is False
    assert "full list" in get_backend("tpu")._extra_details()["fallback_mode"]
    assert get_backend("tpu", list_fallbacks=False)._extra_details() == {}


def test_an_option_the_backend_lacks_is_a_usage_error():
    with pytest.raises(WorkbenchUsageError, match="backend 'cpu' takes no option list_fallbacks"):
        get_backend("cpu", list_fallbacks=True)


def test_warnings_on_descriptor_2_are_counted_once_per_op(capfd):
    warning = (
        "W1203 08:00:00.000001   42 x.cc:1] operator '{}' is not implemented for TPU. "
        "Falling back to CPU\n"
    )
    with StderrWarnings() as captured:
        os.write(2, warning.format("aten::i0").encode())
        os.write(2, b"an unrelated line\n")
        os.write(2, warning.format("aten::i0").encode())
        os.write(2, warning.format("aten::kthvalue.values").encode())
    assert list(captured.ops) == ["aten::i0", "aten::kthvalue.values"]
    assert captured.ops["aten::i0"][0] == 2
    assert captured.ops["aten::i0"][1] == warning.format("aten::i0").strip()
    err = capfd.readouterr().err
    assert err == "an unrelated line\n"
