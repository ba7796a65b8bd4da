"""Likely causes of a numeric difference, from what is known about the two runs.

Each hint is a sentence a user can act on, citing the vendor fact it rests on
(``shared/notes/torchneuron.md``, ``shared/notes/torchtpu.md``). Hints are suggestions, never
verdicts: they name what *could* explain a difference given the dtypes and what the runs did.
"""

from __future__ import annotations

from collections.abc import Iterable

from neuron_workbench.compare import OutputDiff
from neuron_workbench.run.records import Run

_FLOAT64 = ("float64", "complex128")
_INT64 = ("int64",)


def hints_for(diff: OutputDiff, ref: Run, target: Run) -> list[str]:
    """Hints for one failing output (empty for a passing one)."""
    if diff.passed:
        return []
    hints: list[str] = []
    backend = target.backend
    numerics = backend.details.get("numerics", {}) if backend.emulated else {}
    on_neuron = backend.name == "neuron"
    facts = target.facts
    if on_neuron and diff.ref_dtype in _FLOAT64:
        hints.append(
            "float64 is computed as float32 on neuron (TorchNeuron casts 64-bit inputs to 32 bits "
            "and back; torchneuron.md §7): expect float32 precision, or compute this in float32 "
            "on purpose"
        )
    if on_neuron and diff.ref_dtype in _INT64:
        hints.append(
            "int64 arithmetic runs as int32 on neuron (torchneuron.md §7): values beyond ±2^31 "
            "wrap around; keep indices and counters within int32"
        )
    for dtype in facts.autocast_dtypes:
        hints.append(
            f"autocast ({dtype}) was active: matmuls and convolutions ran in {dtype}, so compare "
            "with a lower-precision tolerance (--preset bf16-autocast)"
        )
    if numerics.get("bf16_matmul"):
        hints.append(
            "the bf16 what-if policy was on: float32 matmul/conv inputs were rounded to bfloat16 "
            "(what the compiler's --auto-cast would do; TorchNeuron does not by default)"
        )
    precision = str(numerics.get("matmul_precision", ""))
    if backend.name == "tpu" and precision.startswith("DEFAULT"):
        hints.append(
            "TPU fp32 matmuls default to 1-pass bfloat16 (Precision.DEFAULT; torchtpu.md §5): "
            "torch.set_float32_matmul_precision('highest') gives 6-pass, near-fp32 results"
        )
    if facts.nondeterministic_ops:
        ops = ", ".join(sorted(facts.nondeterministic_ops))
        hints.append(
            f"accumulating scatters ran ({ops}): with repeated indices their summation order, and "
            "so their rounding, differs between devices"
        )
    if facts.dropout_in_training:
        hints.append(
            "dropout ran in training mode: each device draws its own masks; call model.eval() "
            "for a comparison, or --rng cpu to share the masks"
        )
    elif facts.random_ops and not facts.rng_on_cpu:
        ops = ", ".join(sorted(facts.random_ops))
        hints.append(
            f"random numbers were drawn on the device ({ops}): generators differ between devices; "
            "--rng cpu draws them on the CPU for both runs"
        )
    fallback_ops = target.fallback_ops()
    if fallback_ops:
        hints.append(
            f"{len(fallback_ops)} op(s) ran on the CPU instead of {backend.name} "
            f"({_short_list(fallback_ops)}); their results come from CPU kernels"
        )
    return hints


def _short_list(items: Iterable[str], limit: int = 3) -> str:
    items = list(items)
    text = ", ".join(items[:limit])
    return text + (f", +{len(items) - limit} more" if len(items) > limit else "")
