"""OpInfo sweep on emulated neuron vs CPU (``opinfo_sweep.py``, run in a subprocess).

Every op of PyTorch's ``op_db``, forward and backward: every float32 sample (about 18,800), and the
first samples of float16, bfloat16, int32, int64 and bool where CUDA supports them (about 8,000
more); about a minute with two worker processes on a 2-core machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "opinfo_sweep.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("expecttest") is None,
        reason="torch.testing._internal (op_db) needs the expecttest package",
    ),
]


def _sweep(tmp_path: Path, *args: str, timeout: int = 900, env: dict | None = None) -> dict:
    out = tmp_path / "summary.json"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


def test_harness_reports_an_abort_and_carries_on(tmp_path):
    s = _sweep(tmp_path, "--ops", "logit", "--ops", "fft\\.hfft", "--abort-on", "logit")
    assert [(a["key"], a["sample"], a["rc"]) for a in s["aborts"]] == [("logit", 0, -6)]
    assert s["restarts"] == 1
    assert s["ops"] == 2  # logit's later samples and hfft still ran
    assert s["counts"]["match"] == s["samples"] - 1


#: The dtypes swept in CI; float32 with every sample, the others with the first
#: :data:`OTHER_SAMPLES` samples OpInfo generates per op (a deterministic subset, for CI time).
DTYPES = "float32,float16,bfloat16,int32,int64,bool"
OTHER_SAMPLES = 4
#: What a sample may come to besides "match": each a documented rule of the device or the sweep.
EXPLAINED = {
    "rule",  # a numerics rule of the device ran and, switched off, the sample matches
    "precision",  # float16/bfloat16 as far from float32 as the CPU's own result (error ratio)
    "fallback_dtype_gap",  # a CPU fallback meets the CPU kernel's dtype gap, as on the device
    "device_path",  # the op's own code branches on device type (opinfo_sweep.DEVICE_PATH)
    "unsupported_layout",  # sparse tensors on the device: refused with the documented error
    "unsupported_memory_format",  # neuron: a channels_last copy refused with the documented error
    "nondeterministic",  # the CPU reference differs from itself: not compared
    "cpu_error",  # the CPU cannot compute the sample (even through the dtype-gap table)
}


def test_opinfo_sweep_matches_cpu(tmp_path):
    s = _sweep(
        tmp_path,
        "--jobs", "2",
        "--dtypes", DTYPES,
        "--max-samples-other", str(OTHER_SAMPLES),
        "--sample-timeout", "120",
        "--total-timeout", "780",
    )  # fmt: skip
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: F401

    summary = {k: s[k] for k in ("ops", "samples", "counts_by_dtype", "match_rate", "runtime_s")}
    assert s["aborts"] == [] and s["timeouts"] == [], summary
    # every op with a swept dtype ran (the others are listed as skipped)
    assert s["ops"] + len(s["ops_skipped"]) == len(op_db), summary
    assert s["generator_errors"] == []
    assert set(s["counts_by_dtype"]) == set(DTYPES.split(",")), summary
    assert s["counts_by_dtype"]["float32"]["match"] > 18000, summary
    assert all(c["match"] > 1000 for c in s["counts_by_dtype"].values()), summary
    # every sample matches CPU or is explained by a documented rule
    unexplained = {k: v for k, v in s["counts"].items() if k != "match" and k not in EXPLAINED}
    assert unexplained == {}, (summary, s["mismatch_groups"][:5])
    # sparse layouts are refused on purpose, with the documented error
    for g in s["mismatch_groups"]:
        if g["status"] == "unsupported_layout":
            assert all("sparse" in op for op in g["ops"]), g
        # so are channels_last copies on neuron (shared/notes/torchneuron.md §10): the conversion
        # samples that ask for the format, and max_unpool2d's backward of a channels_last input
        # (which makes the gradient contiguous in its input's format)
        if g["status"] == "unsupported_memory_format":
            assert g["example"].endswith(
                "Neuron tensors only support contiguous or preserve memory format"
            ), g
    # the rules that explain samples are the device's (neuron: float64 computed as float32)
    assert set(s["rule_samples"]) <= {"fp64", "int64", "tpu-matmul", "fp64+int64"}, s[
        "rule_samples"
    ]
    # Measured (all float32 samples, 4 per op for the other dtypes): 26,667 of 27,015 samples
    # match; the rest: 235 the CPU cannot compute, 44 sparse refusals, 38 fallbacks meeting a CPU
    # dtype gap, 28 float16/bfloat16 within precision, 2 float_power backward under fp64-as-fp32.
    assert s["match_rate_supported_layouts"] >= 0.995, (summary, s["mismatch_groups"][:5])


def test_opinfo_sweep_on_the_python_core(tmp_path):
    # The pure-Python core follows the same rules: the first sample of every op and dtype.
    s = _sweep(
        tmp_path,
        "--jobs", "2",
        "--dtypes", DTYPES,
        "--max-samples", "1",
        "--max-samples-other", "1",
        "--total-timeout", "600",
        env={"NEURON_WORKBENCH_EMULATOR_CORE": "python"},
    )  # fmt: skip
    summary = {k: s[k] for k in ("ops", "samples", "counts_by_dtype", "runtime_s")}
    assert s["cores"] == ["python"]
    assert s["aborts"] == [] and s["timeouts"] == [] and s["generator_errors"] == [], summary
    unexplained = {k: v for k, v in s["counts"].items() if k != "match" and k not in EXPLAINED}
    assert unexplained == {}, (summary, s["mismatch_groups"][:5])
    assert s["counts"]["match"] > 2500, summary
