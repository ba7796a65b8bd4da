"""OpInfo sweep on emulated neuron vs CPU (``opinfo_sweep.py``, run in a subprocess).

Every op of PyTorch's ``op_db`` with float32 samples, every sample, forward and backward (about
18,800 samples; about a minute with two worker processes on a 2-core machine).
"""

from __future__ import annotations

import importlib.util
import json
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


def _sweep(tmp_path: Path, *args: str, timeout: int = 900) -> dict:
    out = tmp_path / "summary.json"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


def test_harness_reports_an_abort_and_carries_on(tmp_path):
    s = _sweep(tmp_path, "--ops", "logit", "--ops", "fft\\.hfft", "--abort-on", "logit")
    assert [(a["key"], a["sample"], a["rc"]) for a in s["aborts"]] == [("logit", 0, -6)]
    assert s["restarts"] == 1
    assert s["ops"] == 2  # logit's later samples and hfft still ran
    assert s["counts"]["match"] == s["samples"] - 1


def test_opinfo_sweep_matches_cpu(tmp_path):
    s = _sweep(
        tmp_path,
        "--jobs", "2",
        "--sample-timeout", "120",
        "--total-timeout", "780",
    )  # fmt: skip
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: F401

    summary = {k: s[k] for k in ("ops", "samples", "counts", "match_rate", "runtime_s")}
    assert s["aborts"] == [] and s["timeouts"] == [], summary
    # every op with float32 support ran (the others are listed as skipped)
    assert s["ops"] + len(s["ops_skipped"]) == len(op_db), summary
    assert s["generator_errors"] == []
    assert s["samples"] > 18000 and s["cpu_passing"] > 18000, summary
    # sparse layouts are refused on purpose, with the documented error
    for g in s["mismatch_groups"]:
        if g["status"] == "unsupported_layout":
            assert all("sparse" in op for op in g["ops"]), g
    # Measured (all 18,835 samples): 0.9985 overall, 0.9999 without the 26 refused sparse samples;
    # the rest is float_power's backward under neuron's float64-as-float32 policy.
    assert s["match_rate_supported_layouts"] >= 0.999, (summary, s["mismatch_groups"][:5])
    assert s["match_rate"] >= 0.995, (summary, s["mismatch_groups"][:5])
