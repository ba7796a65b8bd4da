"""Real, unmodified models through ``%%neuron`` on emulated neuron and tpu: verdicts that hold.

The corpus (``corpus_runner.py``): GPT-2, BERT, Llama and ResNet from ``transformers`` (tiny
configs, no download) and the PyTorch examples' LSTM word language model and DCGAN, each as a
CUDA-style cell in float32 and under ``torch.autocast("cuda", dtype=torch.bfloat16)``, as a
forward+backward cell and as a full AdamW training step; and training idioms from public code
(``idioms.py``) in both precisions. Every cell takes the default path (the target in a worker
process); the two targets' runners run in parallel.

What must hold for every row:

- no ERROR, except on tpu an op TorchTPU 0.2.0 lacks (CPU fallback is off there by default), named
  in TorchTPU's one-line error text;
- a forward+backward cell passes unless a documented target rule explains each failing output
  (neuron: float64 as float32, int64 as int32; tpu: fp32 matmuls as 1-pass bfloat16), and then the
  output carries that rule's hint;
- a failing training step or idiom names a cause with evidence for each failing output (a rule,
  optimizer amplification, the attention or recurrent-layer kernel, the autocast op lists);
- no hint that the runs contradict: device random numbers when the device draws what the CPU
  draws, autocast in a float32 cell, TF32 in cells that never enable it, TPU matmul precision on
  neuron.
"""

from __future__ import annotations

import re

import pytest
import torch
from corpus_runner import (
    COMPILED_KIND,
    IDIOM,
    all_cases,
    case_id,
    compiled_cases,
    corpus_rows,
    hint_tags,
)

from neuron_workbench.emulator.profiles import load_coverage, packaged_coverage_path

pytestmark = pytest.mark.slow

#: Every model in every precision and cell kind, plus GPT-2, Llama and ResNet compiled.
CASES = all_cases() + compiled_cases()

RULES = ("fp64", "int64", "tpu-matmul", "what-if")
CAUSES = (*RULES, "optimizer", "attention", "rnn-kernel", "autocast-lists")
TPU_MISSING_OP = re.compile(r"operator '(aten::[\w.]+)' is not implemented for TPU")


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    """Every corpus row by id, both targets in parallel subprocesses."""
    return {row["id"]: row for row in corpus_rows(CASES)}


def _rule_explains(failure: dict, target: str, on_neuron: dict | None) -> bool:
    """Whether a documented target rule applies to this output and its hint is there.

    ``on_neuron`` is the same cell's row on neuron: a tpu difference that neuron shows too, to the
    same number, does not come from TPU's matmul precision, whatever the hint says.
    """
    rules = set(hint_tags(failure["hints"])) & set(RULES)
    if target == "neuron":
        return ("fp64" in rules and failure["ref_dtype"] in ("float64", "complex128")) or (
            "int64" in rules and failure["ref_dtype"] == "int64"
        )
    same_on_neuron = any(
        f["path"] == failure["path"] and f["max_abs"] == failure["max_abs"]
        for f in (on_neuron or {}).get("failures", [])
    )
    return "tpu-matmul" in rules and not same_on_neuron


def _tpu_lacks(overload: str) -> bool:
    """Whether TorchTPU 0.2.0 has no kernel for ``aten::name.overload``, even through a composite.

    For a backend without a kernel of its own, the real dispatcher runs an op's composite kernel
    (CompositeImplicitAutograd, CompositeExplicitAutograd[NonFunctional]), so such an op is never
    the one missing: one of its pieces is. Other ops are missing when their base name is not among
    the 0.2.0 wheel's registrations.
    """
    name, _, overload_name = overload.removeprefix("aten::").partition(".")
    native, _ = load_coverage(packaged_coverage_path("tpu"))
    op = getattr(getattr(torch.ops.aten, name), overload_name or "default")
    keys = torch._C.DispatchKey
    composite = any(
        op.has_kernel_for_dispatch_key(key)
        for key in (
            keys.CompositeImplicitAutograd,
            keys.CompositeExplicitAutograd,
            keys.CompositeExplicitAutogradNonFunctional,
        )
    )
    return name not in native and not composite


def _describe(row: dict) -> str:
    lines = [f"{row['id']}: {row['summary']}"]
    for failure in row["failures"][:6]:
        lines.append(f"  {failure['headline']} [{failure['ref_dtype']}]")
        lines += [f"    hint: {h}" for h in failure["hints"]]
    lines += [f"  {role} error: {e['summary']}" for role, e in row["errors"].items()]
    return "\n".join(lines)


@pytest.mark.parametrize("case", CASES, ids=[case_id(*c) for c in CASES])
def test_verdict_holds(rows, case):
    row = rows[case_id(*case)]
    target, _, _, kind = case
    why = _describe(row)
    assert row["verdict"] in ("PASS", "FAIL", "ERROR"), why
    if row["verdict"] == "ERROR":
        assert target == "tpu" and set(row["errors"]) == {"target"}, why
        summary = row["errors"]["target"]["summary"]
        assert "\n" not in row["summary"], why
        missing = TPU_MISSING_OP.search(summary)
        assert missing, f"a tpu ERROR must name the op TorchTPU lacks\n{why}"
        assert _tpu_lacks(missing.group(1)), f"TorchTPU 0.2.0 runs {missing.group(1)}\n{why}"
        return
    if row["verdict"] == "FAIL" and kind == "fwd_bwd":
        on_neuron = rows.get(case_id("neuron", *case[1:]))
        unexplained = [
            f["path"] for f in row["failures"] if not _rule_explains(f, target, on_neuron)
        ]
        assert not unexplained, f"no documented target rule explains {unexplained}\n{why}"
    if row["verdict"] == "FAIL" and kind in ("train", IDIOM, COMPILED_KIND):
        # compiled graphs draw random numbers with the compiler's generator: a cause as well
        causes = set(CAUSES) | ({"random"} if kind == COMPILED_KIND else set())
        uncaused = [f["path"] for f in row["failures"] if not set(hint_tags(f["hints"])) & causes]
        assert not uncaused, f"no cause with evidence named for {uncaused}\n{why}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(*c) for c in CASES])
def test_no_hint_the_runs_contradict(rows, case):
    row = rows[case_id(*case)]
    target, _, precision, _ = case
    tags = set(hint_tags(row["hints"]))
    why = _describe(row)
    if row["rng_matches_cpu"] and case[3] != COMPILED_KIND:
        assert "random" not in tags, f"{target} draws the same random numbers as the CPU\n{why}"
    if precision == "fp32":
        assert not tags & {"autocast", "autocast-lists"}, f"no autocast here\n{why}"
    assert "tf32" not in tags, f"no cell here enables TF32\n{why}"
    if target == "neuron":
        assert "tpu-matmul" not in tags, why


COMPILED = compiled_cases()


@pytest.mark.parametrize("case", COMPILED, ids=[case_id(*c) for c in COMPILED])
def test_compiled_rows_compile_on_both_sides(rows, case):
    # the reference with Inductor's CPU code path, the target with its own backend
    row = rows[case_id(*case)]
    why = _describe(row)
    assert row["compile"]["ref"]["backends"] == ["inductor"], why
    assert row["compile"]["ref"]["graphs"] >= 1, why
    if row["verdict"] != "ERROR":
        assert row["compile"]["target"]["backends"] == [case[0]], why
