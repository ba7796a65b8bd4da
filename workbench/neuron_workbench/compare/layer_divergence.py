"""Where two runs first diverge, from their per-module records (``--layers``).

Aligning two runs' :class:`~neuron_workbench.trace.layers.LayerTrace` records by module name and
call index finds the first module whose output is out of tolerance while its inputs were not: where
the divergence was *born*, as opposed to modules that only *propagate* it. Backward, the same is
done with the gradients the recorder summarized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_workbench.compare.compare import compare_leaf
from neuron_workbench.compare.tolerances import Tolerance, TolerancePolicy
from neuron_workbench.trace.layers import LayerCall, LayerTrace, TensorSummary, json_float

__all__ = [
    "LayerComparison",
    "LayerDivergence",
    "compare_layers",
    "full_output_diffs",
    "summaries_differ",
]


def summaries_differ(ref: TensorSummary, target: TensorSummary, tol: Tolerance) -> float | None:
    """``None`` when the two summaries agree within ``tol``, else a size of the difference.

    The size is the largest of the sampled elements' absolute difference and the norms' difference,
    for plotting error against module order.
    """
    if ref.shape != target.shape or ref.dtype != target.dtype:
        return math.inf
    if ref.nan != target.nan or ref.inf != target.inf:
        return math.inf
    worst = 0.0
    bad = False
    for a, b in zip(ref.sample, target.sample):
        if math.isnan(a) and math.isnan(b) or a == b:
            continue
        d = abs(b - a)
        worst = max(worst, d if math.isfinite(d) else math.inf)
        if not d <= tol.atol + tol.rtol * abs(a):
            bad = True
    norm_gap = abs(target.norm - ref.norm)
    worst = max(worst, norm_gap)
    if norm_gap > tol.atol * math.sqrt(max(ref.numel, 1)) + tol.rtol * ref.norm:
        bad = True
    for a, b in ((ref.min, target.min), (ref.max, target.max)):
        if math.isfinite(a) and math.isfinite(b) and abs(b - a) > tol.atol + tol.rtol * abs(a):
            bad = True
    return worst if bad else None


@dataclass
class LayerDivergence:
    """How one module call compares between the reference and the target run."""

    module: str
    call: int
    module_type: str
    order: int
    error: float
    diverged: bool
    inputs_diverged: bool
    born: bool
    grad_error: float | None = None
    grad_diverged: bool = False
    grad_born: bool = False

    @property
    def label(self) -> str:
        """``features.3`` or ``features.3#2`` for a module's third call."""
        return self.module if self.call == 0 else f"{self.module}#{self.call}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "module": self.module,
            "call": self.call,
            "module_type": self.module_type,
            "order": self.order,
            "error": json_float(self.error),
            "diverged": self.diverged,
            "inputs_diverged": self.inputs_diverged,
            "born": self.born,
            # backward: the gradient w.r.t. the output (None where backward did not reach it)
            "grad_error": json_float(self.grad_error) if self.grad_error is not None else None,
            "grad_diverged": self.grad_diverged,
            "grad_born": self.grad_born,
        }


@dataclass
class LayerComparison:
    """Per-call divergence in execution order, and the first call where a divergence was born.

    ``full_diffs`` holds element-wise comparisons of the modules kept whole (``--layers-full``).
    """

    layers: list[LayerDivergence]
    first: LayerDivergence | None
    full_diffs: list[Any] = field(default_factory=list)
    #: The call whose backward turned matching output gradients into diverging input gradients.
    first_backward: LayerDivergence | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "layers": [d.to_dict() for d in self.layers],
            "first_divergence": self.first.to_dict() if self.first else None,
            "first_backward_divergence": self.first_backward.to_dict()
            if self.first_backward
            else None,
            "full_outputs": [d.to_dict() for d in self.full_diffs],
        }


def full_output_diffs(
    ref: LayerTrace, target: LayerTrace, policy: TolerancePolicy | None = None
) -> list[Any]:
    """Element-wise comparisons of the module outputs both runs kept whole."""
    by_key = {c.key(): c for c in target.calls}
    diffs = []
    for call in ref.calls:
        other = by_key.get(call.key())
        if call.full_output is None or other is None or other.full_output is None:
            continue
        label = call.module if call.call == 0 else f"{call.module}#{call.call}"
        diffs.append(compare_leaf(f"<{label} output>", call.full_output, other.full_output, policy))
    return diffs


def compare_layers(
    ref: LayerTrace, target: LayerTrace, policy: TolerancePolicy | None = None
) -> LayerComparison:
    """Align two traces by (module, call) and find where a divergence is born.

    A call *diverged* when its output summary is out of tolerance (the dtype's default tolerance,
    or the policy's preset). It is *born* there when, in addition, none of its inputs diverged and
    none of the calls nested inside it (its submodules) was born: a container that merely holds the
    culprit is not where the difference appeared.
    """
    policy = policy or TolerancePolicy()
    by_key = {c.key(): c for c in target.calls}
    layers: list[LayerDivergence] = []
    for order, call in enumerate(ref.calls):
        other = by_key.get(call.key())
        if other is None or call.output is None or other.output is None:
            continue
        dtype = getattr(torch, call.output.dtype, None)
        tol = policy.for_output(call.module, dtype, dtype)
        error = summaries_differ(call.output, other.output, tol)
        inputs_bad = len(call.inputs) != len(other.inputs) or any(
            summaries_differ(
                a, b, policy.for_output(call.module, getattr(torch, a.dtype, None), None)
            )
            is not None
            for a, b in zip(call.inputs, other.inputs)
        )
        layers.append(
            LayerDivergence(
                call.module,
                call.call,
                call.module_type,
                order,
                0.0 if error is None else error,
                error is not None,
                inputs_bad,
                False,
            )
        )
    # Born: diverged, inputs fine, and no nested call already born.
    index_of = {(d.module, d.call): i for i, d in enumerate(layers)}
    ref_parent = {
        (c.module, c.call): (ref.calls[c.parent].module, ref.calls[c.parent].call)
        if c.parent is not None
        else None
        for c in ref.calls
    }
    has_born_child: set[tuple[str, int]] = set()
    for d in layers:  # children finish before their parents, so they come first
        key = (d.module, d.call)
        d.born = d.diverged and not d.inputs_diverged and key not in has_born_child
        if d.born or key in has_born_child:
            parent = ref_parent.get(key)
            while parent is not None and parent in index_of:
                has_born_child.add(parent)
                parent = ref_parent.get(parent)
    first = next((d for d in layers if d.born), None)
    if first is None:
        first = next((d for d in layers if d.diverged), None)
    first_backward = _gradient_divergence(ref, by_key, layers, policy)
    return LayerComparison(layers, first, first_backward=first_backward)


def _gradient_divergence(
    ref: LayerTrace,
    target_by_key: dict[tuple[str, int], LayerCall],
    layers: list[LayerDivergence],
    policy: TolerancePolicy,
) -> LayerDivergence | None:
    """Mark gradient divergence per call and return where, going backward, it was born.

    The gradient w.r.t. a call's input is the gradient w.r.t. the output of the call that produced
    that input. A call's backward *created* a divergence when the gradient of its output matched
    but the gradient of an input did not.
    """
    grad_bad: dict[tuple[str, int], bool] = {}
    calls = {c.key(): c for c in ref.calls}
    for d in layers:
        call, other = calls[(d.module, d.call)], target_by_key.get((d.module, d.call))
        if call.grad_output is None or other is None or other.grad_output is None:
            continue
        dtype = getattr(torch, call.grad_output.dtype, None)
        error = summaries_differ(
            call.grad_output, other.grad_output, policy.for_output(d.module, dtype, dtype)
        )
        d.grad_error = 0.0 if error is None else error
        d.grad_diverged = error is not None
        grad_bad[(d.module, d.call)] = d.grad_diverged
    born = []
    parent_of = {
        c.key(): ref.calls[c.parent].key() if c.parent is not None else None for c in ref.calls
    }
    has_born_child: set[tuple[str, int]] = set()
    for d in layers:  # children finish before their parents, so they come first
        key = (d.module, d.call)
        if key in grad_bad and not grad_bad[key] and key not in has_born_child:
            producers = [p for p in calls[key].producers if p is not None]
            d.grad_born = any(grad_bad.get(tuple(p), False) for p in producers)
        if d.grad_born or key in has_born_child:
            # A container whose input comes from the same producer as the culprit's is not
            # where the gradient changed: the call inside it is.
            parent = parent_of.get(key)
            while parent is not None:
                has_born_child.add(parent)
                parent = parent_of.get(parent)
        if d.grad_born:
            born.append(d)
    # Backward runs in reverse order of the forward pass: the last-finished call comes first.
    return max(born, key=lambda d: d.order) if born else None
