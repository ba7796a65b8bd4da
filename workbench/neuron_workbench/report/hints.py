"""Likely causes of a numeric difference, each backed by what the two runs did.

A hint is given only when the runs' evidence supports it: a documented target rule that applies to
the output's dtype (``shared/notes/torchneuron.md``, ``shared/notes/torchtpu.md``), random numbers
that really differed, an optimizer step whose gradients matched but whose update magnified them, a
kernel choice that differs between real devices. A failing output with no supported cause says
"cause not identified" rather than guessing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import torch

from neuron_workbench.backends.tpu import SWITCH_MODULE, SWITCH_NAME, UNIMPLEMENTED_ERROR
from neuron_workbench.compare import OutputDiff
from neuron_workbench.compare.flatten import iter_leaves
from neuron_workbench.compare.tolerances import TolerancePolicy
from neuron_workbench.run.custom_ops import defined_by_notebook, defining_module
from neuron_workbench.run.records import Run, compiled_draws, recorded, same_random_numbers

_FLOAT64 = ("float64", "complex128")
_INT64 = ("int64",)
_LOWER = ("bfloat16", "float16")
_FLOATING = frozenset({"float16", "bfloat16", "float32", "float64", "complex64", "complex128"})

CAUSE_NOT_IDENTIFIED = (
    "cause not identified: no documented target rule, random draw, optimizer or kernel difference "
    "explains it; run with --layers to find the module where it is born"
)


def cause_not_identified(layers: Any = None, kind: str = "tensor") -> str:
    """The hint of a failing output no evidence explains, with what ``--layers`` found if it ran.

    ``layers`` is the runs' :class:`~neuron_workbench.compare.layer_divergence.LayerComparison`
    (None when ``--layers`` was off): advising ``--layers`` to a cell that ran with it sends the
    user to run it again, where its finding (the module where the difference is born) is the lead.
    ``kind`` is the output's (``tensor``, ``number``, ``text``, ``none``): modules' outputs say
    nothing of where a string or another object came from.
    """
    if layers is None:
        return CAUSE_NOT_IDENTIFIED
    start = CAUSE_NOT_IDENTIFIED.split("; run with --layers")[0]
    if kind not in ("tensor", "number"):
        return (
            f"{start}; --layers compares the modules' tensor outputs, not how this value was "
            "made: look at the line that makes it"
        )
    return f"{start}; {layers_finding(layers)}"


def layers_finding(layers: Any) -> str:
    """What ``--layers`` found, as the closing clause of a hint that traces a difference to a pass.

    ``layers`` is the runs' :class:`~neuron_workbench.compare.layer_divergence.LayerComparison`:
    the module call where the difference is born (forward, else backward), or that no traced
    module call shows it.
    """
    first = layers.first
    if first is not None:
        # compare_layers falls back to the first diverged call when none is born (its inputs
        # already differed): say which of the two it is
        where = (
            "is born in module call {} ({}): its inputs matched and its output did not"
            if first.born
            else "first shows in module call {} ({}), whose inputs already differed"
        )
        return "--layers found it " + where.format(first.label, first.module_type)
    backward = layers.first_backward
    if backward is not None:
        return (
            f"--layers found it born in the backward of module call {backward.label} "
            f"({backward.module_type}): its output gradient matched, its input gradient did not"
        )
    if not layers.layers:
        return "--layers traced no module call (the cell called no nn.Module)"
    return (
        "--layers found no module call whose output summary diverged: look at the cell's own "
        "tensor code outside the traced modules"
    )


def not_identified(hints: list[str]) -> bool:
    """Whether ``hints`` are the lone "cause not identified" hint (with or without --layers)."""
    return len(hints) == 1 and hints[0].startswith(CAUSE_NOT_IDENTIFIED.split(":")[0] + ":")


def rounding_hint(ratio: str, label: str) -> str:
    """The hint of a failing output the precision budget measured as rounding (``R`` within budget).

    ``ratio`` and ``label`` are the output's ``R`` as the report writes it and its band
    (:class:`~neuron_workbench.compare.budget.OutputBudget`): against a float64 oracle, the target's
    error is about the reference's own, so the tolerance was tighter than the two runs' rounding
    (a sum over many elements, another op order), which is no cause to look for.
    """
    return (
        f"rounding: against a float64 oracle the target is {label} (R {ratio}); the tolerance is "
        "tighter than this computation's own rounding (--judge budget judges float outputs by R)"
    )


class Evidence:
    """What both runs recorded, looked up once per comparison and shared by every failing output."""

    def __init__(
        self, ref: Run, target: Run, policy: TolerancePolicy | None = None, layers: Any = None
    ) -> None:
        self.ref = ref
        self.target = target
        self.policy = policy or TolerancePolicy()
        #: What --layers found (a LayerComparison), None when it was off.
        self.layers = layers
        self.same_random = same_random_numbers(ref.facts, target.facts)
        self._leaves: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._oracle: tuple[Run, dict[str, Any]] | None = None

    def leaves(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each run's outputs by path (built on first use)."""
        if self._leaves is None:
            self._leaves = (
                dict(iter_leaves(self.ref.outputs)),
                dict(iter_leaves(self.target.outputs)),
            )
        return self._leaves

    def _oracle_leaves(self, oracle: Run) -> dict[str, Any]:
        """The oracle run's outputs by path (built once per oracle)."""
        if self._oracle is None or self._oracle[0] is not oracle:
            self._oracle = (oracle, dict(iter_leaves(oracle.outputs)))
        return self._oracle[1]

    def optimizer_hint(self, diff: OutputDiff) -> str | None:
        """Optimizer evidence for a failing parameter: gradients at ``step()``, and the update's gain."""
        ref_steps = recorded(self.ref.extras.get("optimizer"))
        target_steps = recorded(self.target.extras.get("optimizer"))
        if not (hasattr(ref_steps, "at_step") and hasattr(target_steps, "at_step")):
            return None
        ref_leaves, target_leaves = self.leaves()
        ref_at = ref_steps.at_step(ref_leaves.get(diff.path))
        target_at = target_steps.at_step(target_leaves.get(diff.path))
        if ref_at is None or target_at is None or ref_at.grad is None or target_at.grad is None:
            return None
        if ref_at.grad.shape != target_at.grad.shape:
            return None
        ref_grad = ref_at.grad.double()
        grad_delta = (target_at.grad.double() - ref_grad).abs()
        tol = self.policy.for_output(f"{diff.path}.grad", ref_at.grad.dtype, target_at.grad.dtype)
        allowed = tol.atol + tol.rtol * ref_grad.abs()
        outside = int((grad_delta > allowed).sum())
        max_delta = float(grad_delta.max()) if grad_delta.numel() else 0.0
        step = f"{ref_at.optimizer}.step()"
        if outside:
            # with --layers on, its finding is the lead (advising it would send the user to run
            # the cell again for what this report already holds)
            lead = (
                "--layers finds the module" if self.layers is None else layers_finding(self.layers)
            )
            return (
                f"the gradient already differed at {step} ({outside} of {grad_delta.numel()} "
                f"elements outside tolerance, max|Δ| {max_delta:.1e}): the difference comes from "
                f"the forward or backward pass, not the optimizer; {lead}"
            )
        index = diff.worst_index
        if index is None or len(index) != ref_grad.dim():
            return None
        sensitivity = ref_at.update_sensitivity(index)
        if sensitivity is None or ref_at.eps is None:
            return None
        g = float(ref_grad[index])
        dg = float(grad_delta[index])
        # An Adam-style update moves a weight by at most about lr, so two of them differ by 2 * lr.
        predicted = min(sensitivity * dg, 2 * ref_at.lr) if ref_at.lr else sensitivity * dg
        observed = abs((diff.worst_target or 0.0) - (diff.worst_ref or 0.0))
        if observed == 0.0 or predicted < 0.1 * observed:
            return None
        at = list(index)
        return (
            f"optimizer amplification: gradients matched within tolerance at {step} (max|Δ| "
            f"{max_delta:.1e}), but {ref_at.optimizer} divides each update by sqrt(v)+eps; at "
            f"{at} |grad| is {abs(g):.1e} against eps {ref_at.eps:.0e}, so a gradient difference "
            f"of {dg:.1e} moves the weight by about {predicted:.1e} (observed {observed:.1e}). "
            "The difference was within tolerance before the step; judge the port by the "
            f"gradients, or loosen this output (--tol {diff.path}=RTOL,ATOL)"
        )

    def amplification(self, diff: OutputDiff) -> str | None:
        """Why a weight's difference after an Adam step is its matched gradients' difference.

        Adam and AdamW divide each update by ``sqrt(v) + eps``: where ``|grad|`` is near ``eps``
        an update turns a gradient difference of float32 rounding (a compiler's summation order)
        into a weight difference up to ``lr``. Given when both runs recorded the step, every
        gradient element matched within its tolerance, and every weight element outside its
        tolerance is within it once the update difference those gradients account for is added:
        ``lr * |u(g_ref) - u(g_target)|`` with ``u(g) = g / (|g| + eps)`` on the first step
        (exact), the first-order bound ``sensitivity * |Δg|`` (the larger side's) on later ones.
        None otherwise: the output fails as its tolerance says.
        """
        if diff.status != "differ" or diff.kind != "tensor":
            return None
        ref_steps = recorded(self.ref.extras.get("optimizer"))
        target_steps = recorded(self.target.extras.get("optimizer"))
        if not (hasattr(ref_steps, "at_step") and hasattr(target_steps, "at_step")):
            return None
        ref_leaves, target_leaves = self.leaves()
        ref_value, target_value = ref_leaves.get(diff.path), target_leaves.get(diff.path)
        ref_at, target_at = ref_steps.at_step(ref_value), target_steps.at_step(target_value)
        if ref_at is None or target_at is None or ref_at.grad is None or target_at.grad is None:
            return None
        if (
            ref_at.optimizer not in _ADAM
            or target_at.optimizer != ref_at.optimizer
            or ref_at.eps is None
            or not ref_at.lr
            # Adam's L2 term enters the update with the weight: not modelled here
            or (ref_at.optimizer == "Adam" and (ref_at.weight_decay or 0.0) != 0.0)
            or ref_at.grad.shape != target_at.grad.shape
            or ref_value.shape != ref_at.grad.shape
            or target_value.shape != ref_value.shape
        ):
            return None
        g_ref, g_target = ref_at.grad.double(), target_at.grad.double()
        grad_tol = self.policy.for_output(
            f"{diff.path}.grad", ref_at.grad.dtype, target_at.grad.dtype
        )
        grad_delta = (g_target - g_ref).abs()
        if not bool(grad_delta.isfinite().all()) or bool(
            (grad_delta > grad_tol.atol + grad_tol.rtol * g_ref.abs()).any()
        ):
            return None  # the gradients already differed: the pass, not the optimizer
        bound = _update_difference(ref_at, target_at, g_ref, g_target, grad_delta)
        if bound is None:
            return None
        p_ref = ref_value.detach().to("cpu", torch.float64)
        delta = (target_value.detach().to("cpu", torch.float64) - p_ref).abs()
        allowed = diff.tolerance.atol + diff.tolerance.rtol * p_ref.abs()
        outside = delta > allowed
        if not bool(outside.any()) or not bool(
            (delta[outside] <= allowed[outside] + bound[outside]).all()
        ):
            return None
        count = int(outside.sum())
        small = int((g_ref.abs()[outside] < 10 * ref_at.eps).sum())
        first = "first step, exact" if ref_at.step == 0 else "first-order bound"
        return (
            f"{ref_at.optimizer} amplification, judged by the gradients: {diff.path}'s gradients "
            f"matched within tolerance at {ref_at.optimizer}.step() (max|Δ| "
            f"{float(grad_delta.max()):.1e}); its {count} element(s) outside tolerance "
            f"({small} with |grad| < 10·eps {ref_at.eps:.0e}) differ by no more than "
            f"{ref_at.optimizer}'s division by sqrt(v)+eps makes of those gradient differences "
            f"({first}; max|Δ| {float(delta.max()):.1e})"
        )

    def amplification_within_budget(self, diff: OutputDiff, oracle: Run) -> str | None:
        """Why a weight beyond budget after an Adam step is its gradients' rounding, or None.

        :meth:`amplification` for ``--judge budget``, with the float64 oracle in place of the
        reference: given when the oracle recorded the step too, the target's gradients at it are
        within budget against the oracle's, and every weight element's distance to the oracle
        exceeds the reference's (or the update's own rounding: two ulps of the weight before the
        step, four roundings of the update) by no more than the update difference between the
        target's and the oracle's gradients. Where ``|grad|`` is
        near ``eps`` that difference reaches ``lr`` from float32 rounding alone, in either run,
        so the weights' ``R`` measures which run's rounding the division happened to magnify.
        """
        from neuron_workbench.compare.budget import against_oracle, ulps

        if diff.kind != "tensor":
            return None
        steps = [recorded(run.extras.get("optimizer")) for run in (self.ref, self.target, oracle)]
        if not all(hasattr(each, "at_step") for each in steps):
            return None
        ref_leaves, target_leaves = self.leaves()
        oracle_leaves = self._oracle_leaves(oracle)
        values = [leaves.get(diff.path) for leaves in (ref_leaves, target_leaves, oracle_leaves)]
        if not all(isinstance(v, torch.Tensor) for v in values):
            return None
        ref_at, target_at, oracle_at = (
            each.at_step(value) for each, value in zip(steps, values, strict=True)
        )
        if ref_at is None or target_at is None or oracle_at is None:
            return None
        grads = (ref_at.grad, target_at.grad, oracle_at.grad)
        if (
            any(g is None or g.shape != values[0].shape for g in grads)
            or any(v.shape != values[0].shape for v in values)
            or ref_at.optimizer not in _ADAM
            or len({ref_at.optimizer, target_at.optimizer, oracle_at.optimizer}) != 1
            or oracle_at.eps is None
            or not oracle_at.lr
            or (oracle_at.optimizer == "Adam" and (oracle_at.weight_decay or 0.0) != 0.0)
        ):
            return None
        g_ref, g_target, g_oracle = (g.double() for g in grads)  # type: ignore[union-attr]
        gradients = against_oracle(f"{diff.path}.grad", ref_at.grad, g_target, g_oracle)  # type: ignore[arg-type]
        if not gradients.within:
            return None  # the gradients are less accurate: the pass, not the optimizer
        bound = _update_difference(
            oracle_at, target_at, g_oracle, g_target, (g_target - g_oracle).abs()
        )
        if bound is None:
            return None
        w_ref, w_target, w_oracle = (v.detach().to("cpu", torch.float64) for v in values)
        lr = oracle_at.lr
        # The update's size per element: exact on the first step (lr * |g| / (|g| + eps)), at most
        # lr on later ones (Adam's m_hat / sqrt(v_hat) is about one, whatever the gradient's scale).
        update = (
            lr * g_oracle.abs() / (g_oracle.abs() + oracle_at.eps)
            if oracle_at.step == 0
            else torch.full_like(g_oracle, lr)
        )
        # The update's own rounding in the weight's dtype, however exact the reference happens to
        # be: two ulps of the larger of the weight before and after the step (decay, subtraction),
        # and four roundings of the update (moments, square root, eps, division).
        dtype = values[0].dtype
        rounding = 2 * ulps(w_oracle.abs() + update, dtype) + 4 * torch.finfo(dtype).eps * update
        slack = torch.maximum((w_ref - w_oracle).abs(), rounding)
        excess = (w_target - w_oracle).abs() - slack
        if not bool(excess.isfinite().all()) or bool((excess > bound).any()):
            return None
        beyond = int((excess > 0).sum())
        first = "first step, exact" if oracle_at.step == 0 else "first-order bound"
        return (
            f"{oracle_at.optimizer} amplification, judged by the gradients: {diff.path}'s "
            f"gradients at {oracle_at.optimizer}.step() are within budget against the float64 "
            f"oracle's (R {gradients.factor}); its {beyond} element(s) farther from the oracle than "
            f"the reference's are no farther than {oracle_at.optimizer}'s division by sqrt(v)+eps "
            f"makes of those gradient differences ({first})"
        )


#: Optimizers whose update the amplification judge models (``lr * m_hat / (sqrt(v_hat) + eps)``).
_ADAM = frozenset({"Adam", "AdamW"})


def _update_difference(
    ref_at: Any,
    target_at: Any,
    g_ref: torch.Tensor,
    g_target: torch.Tensor,
    grad_delta: torch.Tensor,
) -> torch.Tensor | None:
    """How far apart the two runs' Adam updates can be, per element, from their gradients alone."""
    lr, eps = ref_at.lr, ref_at.eps
    if not _same_step(ref_at, target_at):
        return None
    if ref_at.step == 0 and target_at.step == 0:
        # first step: m_hat = g and v_hat = g**2, so the update is lr * g / (|g| + eps)
        return lr * (g_ref / (g_ref.abs() + eps) - g_target / (g_target.abs() + eps)).abs()
    beta1 = ref_at.beta1 if ref_at.beta1 is not None else 0.9
    beta2 = ref_at.beta2 if ref_at.beta2 is not None else 0.999
    t = ref_at.step + 1
    largest = _largest_update(lr, beta1, beta2, t)
    if largest is None:
        return None
    sensitivities = []
    for at, g in ((ref_at, g_ref), (target_at, g_target)):
        if at.second_moment is None or at.second_moment.shape != g.shape:
            return None
        v_hat = (beta2 * at.second_moment.double() + (1 - beta2) * g * g) / (1 - beta2**t)
        sensitivities.append(lr * (1 - beta1) / (1 - beta1**t) / (v_hat.sqrt() + eps))
    # The first-order bound grows without limit where v is about 0 (a unit no batch reached); no
    # two Adam updates differ by more than twice the largest one.
    return (torch.maximum(*sensitivities) * grad_delta).clamp(max=2 * largest)


def _same_step(a: Any, b: Any) -> bool:
    """Whether two records are of the same step of equally set optimizers."""
    return all(
        getattr(a, name) == getattr(b, name)
        for name in ("optimizer", "step", "lr", "eps", "beta1", "beta2", "weight_decay")
    )


def _largest_update(lr: float, beta1: float, beta2: float, t: int) -> float | None:
    """The most one Adam step ``t`` (1-based) can move an element: ``lr * max|m_hat| / sqrt(v_hat)``.

    With ``m`` and ``v`` the decayed sums of ``g`` and ``g**2``, Cauchy-Schwarz gives
    ``|m_t| / sqrt(v_t) <= (1 - beta1) / sqrt((1 - beta2) * (1 - beta1**2 / beta2))`` whatever the
    gradients; the bias corrections scale it by ``sqrt(1 - beta2**t) / (1 - beta1**t)``. None when
    ``beta1**2 >= beta2`` (no such bound).
    """
    if not 0.0 <= beta1 < 1.0 or not 0.0 < beta2 < 1.0 or beta1 * beta1 >= beta2:
        return None
    ratio = (1 - beta1) / math.sqrt((1 - beta2) * (1 - beta1 * beta1 / beta2))
    return lr * ratio * math.sqrt(1 - beta2**t) / (1 - beta1**t)


#: The float64 rule as the hints on a float64 output and on a failed float64 gradcheck state it.
_FP64_RULE = (
    "float64 is computed as float32 on neuron (TorchNeuron casts 64-bit inputs to 32 bits and "
    "back; torchneuron.md §7)"
)


def hints_for(
    diff: OutputDiff, ref: Run, target: Run, evidence: Evidence | None = None
) -> list[str]:
    """Hints for one failing output (empty for a passing one); never a guess."""
    if diff.passed:
        return []
    evidence = evidence or Evidence(ref, target)
    hints: list[str] = []
    backend = target.backend
    numerics = backend.details.get("numerics", {}) if backend.emulated else {}
    on_neuron = backend.name == "neuron"
    dtypes = {diff.ref_dtype, diff.target_dtype}
    floating = bool(dtypes & _FLOATING)
    fp64_ops = _rule_ran(target, "fp64")
    if on_neuron and diff.status == "missing":
        # an output one run has and the other lacks has no dtype of its own to say which rule
        hints.extend(_rules_behind_a_missing_output(target))
    elif on_neuron and dtypes & set(_FLOAT64) and fp64_ops:
        hints.append(
            f"{_FP64_RULE}{_ran(fp64_ops, 'float64 op')}: expect float32 "
            "precision, or compute this in float32 on purpose"
        )
    if on_neuron and dtypes & set(_INT64) and diff.status != "missing":
        int64_hint = _int64_wrapped_hint(target)
        if int64_hint:
            hints.append(int64_hint)
    if on_neuron and not dtypes & set(_INT64) and diff.status != "missing":
        # An output of another dtype picked or computed with int64 values that wrapped (an
        # embedding row chosen by a hashed id, a count cast to float, a label or a flag) changes
        # with them: its dtype does not say int64, but where the run counted a wrap that is its
        # evidence, as for an output one run lacks, and first, as there (it changed values).
        counts = getattr(target.facts, "rule_ops", None) or {}
        wrapped = _int64_wrapped_hint(target) if counts.get("int64-wrapped", 0) > 0 else None
        if wrapped:
            hints.append(
                f"{wrapped}; an output picked or computed with wrapped values (a row chosen by "
                "an index, a label, a flag, a float taken from a count) changes with them"
            )
    # The float64 rule for an output of another dtype, where float32 was counted changing a float64
    # value, comes after the int64 rule that its own dtype names: both are the whole run's
    # evidence, the first names the cause (the summary's short cause).
    fp64_rounded = _fp64_rounded_evidence(target)
    if on_neuron and fp64_rounded and not dtypes & set(_FLOAT64) and diff.status != "missing":
        if floating:
            # A float32 output taken from float64 values (a noise schedule built in float64,
            # then `.float()`) keeps float32's rounding of them: its dtype does not say float64.
            taken = (
                f"a {diff.target_dtype} output taken from float64 values (.float(), "
                ".to(torch.float32)) keeps float32's rounding of their computation"
            )
        elif diff.kind == "text":
            # A metric formatted into a log line or a label (f"acc={acc:.4f}") has no dtype:
            # its digits are the float64 values' as float32 rounded them, not an index or count.
            taken = (
                "a text written from float64 values (an f-string, str() or format() of a number) "
                "shows their digits as float32 rounded them"
            )
        else:
            # An index or count taken from float64 values (argmax, comparisons, rounding)
            # changes with them: the int64 rule is not the only one for an integer output.
            taken = (
                "an integer output taken from float64 values (argmax, comparisons, rounding) "
                "changes where float32 rounds them together"
            )
        hints.append(
            f"float64 is computed as float32 on neuron (torchneuron.md §7){fp64_rounded}: {taken}"
        )
    autocast = sorted(set(ref.facts.autocast_dtypes) | set(target.facts.autocast_dtypes))
    ref_casts, target_casts = set(ref.facts.autocast_dtypes), set(target.facts.autocast_dtypes)
    if (
        ref_casts != target_casts
        and {diff.ref_dtype, diff.target_dtype} <= set(_LOWER)
        and diff.ref_dtype != diff.target_dtype
    ):
        # bfloat16 against float16: not which ops autocast casts, but to what
        hints.append(_autocast_dtypes_hint(ref, target, backend.label))
    elif autocast and diff.ref_dtype != diff.target_dtype and dtypes & set(_LOWER):
        if _stands_in_for_cuda(ref) and ref.facts.cpu_autocast:
            # Not the backends' lists: the reference's CPU autocast cast the host tensors that
            # stand for the cell's cuda ones, which a GPU's CPU autocast leaves alone.
            hints.append(
                f"this output is {diff.ref_dtype} on {ref.backend.label} but "
                f"{diff.target_dtype} on {backend.label}: the cell entered CPU autocast "
                '(torch.autocast("cpu"), or torch.autocast(device_type=x.device.type), which '
                "reads cpu there), and on the cpu reference it casts the cell's cuda tensors with "
                "the CPU's op lists, where a GPU casts them with CUDA's: write "
                'torch.autocast("cuda", ...) to compare them (README, Known limits)'
            )
        else:
            hints.append(
                f"autocast op lists differ: this output is {diff.ref_dtype} on "
                f"{ref.backend.label} but {diff.target_dtype} on {backend.label}, so the two "
                f"backends cast different ops under autocast ({', '.join(autocast)})"
            )
    bf16_passes = _rule_ran(target, "tpu-matmul") if floating else 0
    if numerics.get("bf16_matmul") and bf16_passes:
        hints.append(
            "the bf16 what-if policy was on: float32 matmul/conv inputs were rounded to bfloat16 "
            f"(what the compiler's --auto-cast would do; TorchNeuron does not by default)"
            f"{_ran(bf16_passes, 'float32 matmul/conv op', 'in bfloat16')}"
        )
    precision = str(numerics.get("matmul_precision", ""))
    # The ops counted at one pass, where the run counted them: the mode in the details is the one
    # before the cell ran, and a cell that sets 'high' or 'highest' runs its matmuls at that mode.
    # A run that did not count them (a real device, an older artifact) falls back on the mode.
    one_pass = _rule_ran(target, "tpu-matmul-1pass") if floating else 0
    if "tpu-matmul-1pass" not in (getattr(target.facts, "rule_ops", None) or {}):
        one_pass = bf16_passes if precision.startswith("DEFAULT") else 0
    if backend.name == "tpu" and one_pass:
        also = (
            " (under autocast too: the matmuls it leaves in float32, such as attention's math "
            "path, which upcasts)"
            if autocast
            else ""
        )
        hints.append(
            f"TPU fp32 matmuls default to 1-pass bfloat16 (Precision.DEFAULT; torchtpu.md §5){also}"
            f"{_ran(one_pass, 'float32 matmul/conv op', 'in 1-pass bfloat16')}: "
            "torch.set_float32_matmul_precision('highest') gives 6-pass, near-fp32 results"
        )
    tf32 = [run.backend.label for run in (ref, target) if run.facts.tf32_matmuls]
    if tf32:
        hints.append(
            f"TF32: {', '.join(tf32)} rounded float32 matmul inputs to 10 mantissa bits, as the "
            "cell enabled (allow_tf32, fp32_precision or set_float32_matmul_precision); "
            "--ref-precision fp32 turns it off on a cpu reference"
        )
    # On the host (the cpu reference, an emulated device) both runs execute the same CPU kernel,
    # in the same order: only a real device's scatter kernel makes the order vary.
    scatters = ref.facts.nondeterministic_ops or target.facts.nondeterministic_ops
    if scatters and _real_device(ref, target):
        ops = ", ".join(
            sorted(set(ref.facts.nondeterministic_ops) | set(target.facts.nondeterministic_ops))
        )
        hints.append(
            f"accumulating scatters ran ({ops}): with repeated indices their summation order, and "
            "so their rounding, differs between devices"
        )
    drew = sorted(set(ref.facts.random_ops) | set(target.facts.random_ops))
    # --rng cpu shares the draws the mode sees, not those inside compiled graphs
    in_graphs = bool(compiled_draws(ref.facts, target.facts))
    rng_on_cpu = ref.facts.rng_on_cpu and target.facts.rng_on_cpu
    if evidence.same_random is not True and (in_graphs or not rng_on_cpu):
        if drew:
            seen = "differed" if evidence.same_random is False else "cannot be compared"
            dropout = ref.facts.dropout_in_training or target.facts.dropout_in_training
            if in_graphs:
                way_out = (
                    f"{'call model.eval() for a comparison; ' if dropout else ''}inside a "
                    "compiled graph the compiler draws them with its own generator, which "
                    "--rng cpu does not reach"
                )
            elif dropout:
                way_out = "call model.eval() for a comparison, or --rng cpu to share the masks"
            else:
                way_out = "--rng cpu draws them on the CPU for both runs"
            hints.append(
                f"random numbers drawn on the device {seen} between the runs "
                f"({_short_list(drew)}): {way_out}"
            )
    optimizer = evidence.optimizer_hint(diff)
    if optimizer:
        hints.append(optimizer)
    if (ref.facts.attention_calls or target.facts.attention_calls) and _real_device(ref, target):
        hints.append(
            "scaled_dot_product_attention ran: real devices pick different attention kernels "
            "(flash, memory-efficient, math), whose summation order, and so rounding, differs"
        )
    if (ref.facts.rnn_calls or target.facts.rnn_calls) and (autocast or _real_device(ref, target)):
        hints.append(
            "recurrent layers ran (LSTM/GRU/RNN): CUDA runs them as one cuDNN kernel, other "
            "devices as per-cell matmuls and gate ops, which round differently"
            + (f", most visibly in {', '.join(autocast)}" if autocast else "")
        )
    fallback_ops = target.fallback_ops()
    if fallback_ops and not backend.emulated:
        hints.append(
            f"{len(fallback_ops)} op(s) ran on the CPU instead of {backend.name} "
            f"({_short_list(fallback_ops)}); their results come from CPU kernels"
        )
    if not hints:
        hints.append(cause_not_identified(evidence.layers, diff.kind))
    return hints


_AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA", "xpu": "AutocastXPU"}


def _stands_in_for_cuda(run: Run) -> bool:
    """Whether ``run`` is the cpu reference standing in for the cell's cuda."""
    return run.backend.details.get("stands_in_for") == "cuda"


def _autocast_dtypes_hint(ref: Run, target: Run, target_label: str) -> str:
    """The runs autocast to different dtypes; on the cpu reference, why it may have.

    An autocast without a dtype takes its device type's default: CUDA's and TorchNeuron's float16,
    the CPU's (and TorchTPU's) bfloat16. A cell that reads the device type from a tensor
    (``torch.autocast(device_type=x.device.type)``) autocasts the CPU way on the cpu reference,
    where ``x`` is a CPU tensor.
    """
    hint = (
        f"the runs autocast to different dtypes: {ref.backend.label} to "
        f"{', '.join(ref.facts.autocast_dtypes) or 'none'}, {target_label} to "
        f"{', '.join(target.facts.autocast_dtypes) or 'none'}"
    )
    if _stands_in_for_cuda(ref) and "bfloat16" in ref.facts.autocast_dtypes:
        hint += (
            "; an autocast whose device type the cell reads from a tensor "
            "(torch.autocast(device_type=x.device.type)) is CPU autocast on the cpu reference, "
            'bfloat16 unless the cell names a dtype: write torch.autocast("cuda", ...) or name '
            "the dtype (README, Known limits)"
        )
    return hint


def autocast_registration_hint(run: Run) -> str | None:
    """Why a library op can fail under autocast on the run's device, when that is what happened.

    Libraries register their ops' autocast wrappers per device (torchvision: CPU, CUDA, XPU); on
    another device such an op receives the mixed dtypes autocast produced, and its kernel may refuse
    them. Given only for a run that failed under autocast after one of its ops without a wrapper
    for the device ran (on the CPU, as a fallback: an op the device has no kernel for).
    """
    if run.error is None or not run.facts.autocast_dtypes:
        return None
    device = run.backend.name
    if device in _AUTOCAST_KEYS:
        return None
    for op in run.fallback_ops():
        name = op.split(".")[0]
        if name.startswith("aten::") or "::" not in name:
            continue
        wrapped = [dev for dev, key in _AUTOCAST_KEYS.items() if _has_kernel(name, key)]
        if wrapped and not _has_kernel(name, "AutocastPrivateUse1"):
            return (
                f"{name} has autocast wrappers for {', '.join(wrapped)} only, none for {device} "
                "(its library registers them per device): under autocast its inputs keep the "
                "mixed dtypes autocast gave them; cast them to one dtype before the call, or call "
                f"it inside torch.autocast('{device}', enabled=False)"
            )
    return None


#: PyTorch's own refusals of a tensor on an accelerator, the same on CUDA as on any device, that
#: the CPU standing in for cuda cannot make (it holds every tensor on the CPU): a part of the
#: target's error message, another it must hold too, what the target refused, and the fix when
#: the cell is at fault.
_CUDA_REFUSES_TOO = (
    (
        "Expected all tensors to be on the same device",
        "cpu",  # the check names both devices: a mix of two accelerators is no host's doing
        "a CPU tensor next to one on the device",
        "If the cell does this, move it to the device in the cell; if the tensor was on cuda in an "
        "earlier cell, the workbench did not see it there (README, Known limits): make or move it "
        "in this cell; if it came from torch.load of a file a %%neuron cell saved, that file holds "
        'the reference\'s CPU tensors: pass map_location="cuda"',
    ),
    (
        "device type tensor to numpy",
        "",
        "NumPy of a tensor on the device",
        "Copy it to the host first: .cpu().numpy()",
    ),
    (
        # pack_padded_sequence keeps a lengths tensor where it is; its kernel wants it on the CPU
        "'lengths' argument should be a 1D CPU int64 tensor",
        "",
        "pack_padded_sequence's lengths on the device",
        "Pass them on the CPU: pack_padded_sequence(x, lengths.cpu(), ...)",
    ),
    (
        # a forked DataLoader worker (or multiprocessing child) making or moving device tensors;
        # CUDA's text is "Cannot re-initialize CUDA in forked subprocess"
        "Cannot re-initialize Neuron runtime in forked subprocess",
        "",
        "the device in a forked child process (a DataLoader worker's __getitem__ or collate_fn)",
        "Keep the dataset on the CPU and move each batch in the loop (batch.cuda(non_blocking="
        "True)), or start the workers with DataLoader(..., multiprocessing_context='spawn')",
    ),
    (
        # the same on the emulated tpu, which cannot send device tensors out of a child process
        "the emulated tpu cannot be used in a forked subprocess",
        "",
        "the device in a forked child process (a DataLoader worker's __getitem__ or collate_fn)",
        "Keep the dataset on the CPU and move each batch in the loop (batch.cuda(non_blocking="
        "True))",
    ),
)


def cuda_refuses_too_hint(ref: Run, target: Run) -> str | None:
    """Why the target alone refused what the cell did with a tensor on its device, when it did.

    PyTorch refuses a CPU tensor next to a device one, and NumPy of a device tensor, on CUDA as on
    any accelerator; the CPU standing in for cuda holds every tensor on the CPU and cannot refuse
    them. Given only when that reference ran the cell and the target raised such a refusal. For a
    mix, which tensor was on the CPU is not known: the cell's own mistake, or a tensor an earlier
    cell had on cuda that the workbench could not see there (README, "Known limits").
    """
    if target.error is None or ref.error is not None:
        return None
    if not _stands_in_for_cuda(ref):
        return None
    message = target.error.message
    for refusal, also, what, fix in _CUDA_REFUSES_TOO:
        if refusal in message and also in message:
            return (
                f"the target refused {what}, as CUDA does; the cpu reference holds every tensor on "
                f"the CPU and cannot refuse it. {fix}"
            )
    return None


def cpu_lacks_half_fft_hint(ref: Run) -> str | None:
    """Why the cpu reference refused a float16 FFT that a CUDA GPU computes, when it did.

    The CPU has no float16 FFT kernel ("Unsupported dtype Half"); cuFFT computes float16 FFTs
    whose transformed sizes are powers of two (torch.fft's documentation), so on a GPU the line may
    run. Given only when the CPU stood in for cuda and refused a line that calls an FFT.
    """
    error = ref.error
    if error is None or not _stands_in_for_cuda(ref):
        return None
    if error.message != "Unsupported dtype Half" or "fft" not in error.line:
        return None
    return (
        "the CPU has no float16 FFT, so the cpu reference cannot stand in for cuda here: CUDA "
        "computes float16 FFTs whose transformed sizes are powers of two (and none in bfloat16). "
        "Compute the FFT in float32 (x.float()) to compare it"
    )


def float64_gradcheck_hint(ref: Run, target: Run) -> str | None:
    """Why ``torch.autograd.gradcheck`` failed on neuron alone, when float64 ops ran there.

    gradcheck compares analytical gradients with finite differences taken with ``eps=1e-6`` in
    float64; neuron computes float64 as float32 (torchneuron.md §7), whose rounding swamps such a
    step, so the check fails there however correct the backward is. Given only when the reference
    passed the check and the target counted float64 ops (or did not count them).
    """
    if ref.error is not None or target.error is None or target.backend.name != "neuron":
        return None
    if target.error.type != "GradcheckError":  # gradgradcheck raises it too
        return None
    fp64_ops = _rule_ran(target, "fp64")
    if not fp64_ops:
        return None
    return (
        f"{_FP64_RULE}{_ran(fp64_ops, 'float64 op')}: gradcheck's finite differences "
        "(eps=1e-6) need float64 precision, so the check fails on neuron whatever the backward; "
        "the reference passed it. Run gradcheck on the CPU, or give it eps, atol and rtol for "
        "float32"
    )


_MISSING_OP = re.compile(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'")


def kernel_only_op_hint(ref: Run, target: Run) -> str | None:
    """Why ``torch.ops.<ns>.<op>`` was missing on the target alone: only the kernel registered it.

    An op registered with ``torch.library.Library`` by a notebook cell, a ``custom_op`` a notebook
    defined before ``%load_ext`` (the worker defines the others too: ``run.custom_ops``), or an op
    of a module only the kernel imported, exists only there. Given when the reference ran the call
    and the target did not find the op; where this process knows the op's definition
    (``torch.library.custom_op``), its module is named.
    """
    if target.error is None or ref.error is not None or target.error.type != "AttributeError":
        return None
    found = _MISSING_OP.search(target.error.message)
    if found is None:
        return None
    namespace, op = found.groups()
    name = f"torch.ops.{namespace}.{op}"
    module = defining_module(f"{namespace}::{op}")
    if module == "__main__" and defined_by_notebook(f"{namespace}::{op}"):
        return (
            f"{name} was defined with torch.library.custom_op by a notebook cell, and its "
            "functions could not be pickled to define it in the target's worker process too (one "
            "holds a lock, an open file or a connection): run this cell with --executor inprocess"
        )
    if module == "__main__":  # a custom_op defined before %load_ext: its calls were not kept
        return (
            f"{name} was defined with torch.library.custom_op by a notebook cell that ran before "
            "%load_ext neuron_workbench, so the target's worker process could not define it too: "
            "run the cell that defines it again, or run this one with --executor inprocess"
        )
    if module is not None:
        return (
            f"{name} was registered by module {module}, which the kernel imported and the "
            f"target's worker process did not: import {module} in this cell, or run the cell with "
            "--executor inprocess"
        )
    return (
        f"{name} exists only in the kernel: a notebook cell registered it with torch.library's "
        "Library API, or a module only the kernel imported did, and the target's worker process "
        "ran neither (README, Known limits): define a notebook's op with "
        "torch.library.custom_op (the worker defines those too), import that module in this "
        "cell, or run the cell with --executor inprocess"
    )


def missing_tpu_op_hint(ref: Run, target: Run) -> str | None:
    """What to do when TorchTPU had no kernel for an op the cell ran, and stopped there.

    TorchTPU's CPU fallback is off by default (``shared/notes/torchtpu.md`` §3), so the first op
    without a TPU kernel raises, which says nothing of the others after it. Given when the
    reference ran the cell and the target raised TorchTPU's "not implemented" error; a
    ``GradScaler`` step's op (``aten::_amp_*``) also gets the reason a TPU cell needs no scaler.
    """
    if target.error is None or ref.error is not None or target.backend.name != "tpu":
        return None
    found = UNIMPLEMENTED_ERROR.search(target.error.message)
    if found is None:
        return None
    op = found.group("op")
    hint = (
        f"TorchTPU has no kernel for {op}, and its CPU fallback is off by default, so the run "
        "stopped at the first such op: --list-fallbacks runs the cell with the fallback on and "
        f"lists every op it needs (on a TPU: {SWITCH_MODULE}.{SWITCH_NAME} = True); or replace "
        "the op"
    )
    if op.startswith("aten::_amp_"):
        hint += (
            "; it is GradScaler's: float16 needs loss scaling, bfloat16 (float32's exponent range) "
            'does not: train under torch.autocast("cuda", dtype=torch.bfloat16) without a scaler'
        )
    return hint


def _has_kernel(name: str, key: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, key))
    except RuntimeError:  # the op is not registered in this process
        return False


def _rule_ran(run: Run, rule: str) -> int:
    """How many ops a documented numeric rule touched in ``run``; -1 when the run did not count.

    Emulated devices count them (``RunFacts.rule_ops``); a real device or an artifact from an
    older version does not, and then the output's dtype is the only evidence (-1, truthy).
    """
    counts = getattr(run.facts, "rule_ops", None)
    if counts is None:
        return -1
    return int(counts.get(rule, 0))


def _int64_wrapped_hint(target: Run) -> str | None:
    """The int64-as-int32 hint where the run shows a value wrapped around; None where it shows none.

    An int64 op that ran as int32 changes nothing while its values fit in int32: the emulator
    counts the ops in which narrowing changed a value (``"int64-wrapped"``), and without one the
    rule cannot explain a difference. A run that did not count them (a real device, an artifact
    from an older version) has the op count, or only the output's dtype, as its evidence.
    """
    int64_ops = _rule_ran(target, "int64")
    counts = getattr(target.facts, "rule_ops", None) or {}
    if "int64-wrapped" not in counts:
        if not int64_ops:
            return None
        return (
            "int64 arithmetic runs as int32 on neuron (torchneuron.md §7)"
            f"{_ran(int64_ops, 'int64 op')}: values beyond ±2^31 wrap around; keep indices and "
            "counters within int32"
        )
    wrapped = int(counts["int64-wrapped"])
    if not wrapped:
        return None
    return (
        "int64 arithmetic runs as int32 on neuron (torchneuron.md §7), and it wrapped values "
        f"around in this run: {wrapped} of {int64_ops} int64 op{'' if int64_ops == 1 else 's'} "
        "had a value beyond ±2^31; keep indices and counters within int32"
    )


def _fp64_rounded_evidence(target: Run) -> str:
    """`` (2 of 5 float64 ops ... in this run)`` where float32 changed a float64 value; else empty.

    The evidence for the float64 rule behind an output of another dtype: a float64 op whose values
    float32 holds (a GradScaler's power-of-two scale and its reciprocal, ``x.double() + 1`` on
    small integers) computes on neuron what it computes on CUDA, so float64 ops that ran explain
    no difference; the emulator counts those in which float32 rounded a value
    (``"fp64-rounded"``). A run that did not count them (recorded before) has the float64 ops
    that ran as its evidence, as before; one that counted neither (a real device) has none.
    """
    counts = getattr(target.facts, "rule_ops", None)
    fp64_ops = _rule_ran(target, "fp64")
    if counts is None or "fp64-rounded" not in counts:
        return _ran(fp64_ops, "float64 op") if fp64_ops > 0 else ""
    rounded = int(counts["fp64-rounded"])
    if not rounded:
        return ""
    return (
        f" ({rounded} of {fp64_ops} float64 op{'' if fp64_ops == 1 else 's'} rounded a value "
        "float32 cannot hold in this run)"
    )


def _rules_behind_a_missing_output(target: Run) -> list[str]:
    """The neuron rules that changed values in ``target``, for an output only one run has.

    A list one run made longer, a dict keyed by computed values (token ids, a ``Counter``): the
    entry follows values computed elsewhere in the cell, so only what the run counted is evidence
    (int64 ops that wrapped a value, float64 ops in which float32 rounded one), not a dtype; the
    wrap-around, which changed values for certain, comes first. A run that did not count them
    gives none.
    """
    hints = []
    counts = getattr(target.facts, "rule_ops", None) or {}
    wrapped = _int64_wrapped_hint(target) if counts.get("int64-wrapped", 0) > 0 else None
    if wrapped:
        hints.append(wrapped)
    fp64_rounded = _fp64_rounded_evidence(target)
    if fp64_rounded:
        hints.append(
            "float64 is computed as float32 on neuron (torchneuron.md §7)"
            f"{fp64_rounded}: an output one run has and the other "
            "lacks (a longer list, a dict keyed by computed values) follows the values it was "
            "built from, which change where float32 rounds them together"
        )
    return hints


def _ran(count: int, what: str, how: str = "") -> str:
    """`` (3 float32 matmuls ran in bfloat16)``: the evidence, when it was counted."""
    if count < 0:
        return ""
    plural = "" if count == 1 else "s"
    return f" ({count} {what}{plural} ran{' ' + how if how else ''} in this run)"


def _real_device(*runs: Run) -> bool:
    """Whether either run was on a real accelerator (whose attention kernels are its own)."""
    return any(r.backend.name not in ("cpu",) and not r.backend.emulated for r in runs)


def _short_list(items: Iterable[str], limit: int = 3) -> str:
    items = list(items)
    text = ", ".join(items[:limit])
    return text + (f", +{len(items) - limit} more" if len(items) > limit else "")
