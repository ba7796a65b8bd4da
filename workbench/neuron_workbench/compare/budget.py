"""The precision budget: how far each output is from a float64 oracle, against the reference's own.

For every floating output the reference's error against a float64 rerun of the same cell (the
*noise floor*) is what the reference itself can promise; the target's error against the same oracle,
divided by that floor, is the error ratio ``R``. ``R`` about 1 means the target is as accurate as the
reference; a target-only bug gives a large ``R`` whatever the tolerances.

The oracle is a **promoting function mode**, not shadow execution: the cell runs once more on the
reference path (CUDA semantics on the host, :func:`~neuron_workbench.run.executor.execute`) with the
run's inputs widened to float64, the default dtype float64, every floating tensor argument widened,
and every cast or ``dtype=`` to a lower floating dtype kept at float64. Random numbers are drawn in
the cell's own dtype and then widened, so the oracle sees the reference's draws. A mode was chosen
over shadow execution because the cell's control flow, modules and optimizers then run unchanged
and at plain float64 speed, with no tensor subclass to leak into user code.

What cannot be promoted, and is marked: an output whose oracle value is not float64 (computed
outside torch, bit reinterpretation with ``view(dtype)``, a dtype the cell branches on), or is
missing or of another shape; then, as when the oracle run raises, a *random-rounding* rerun of the
reference gives the floor instead (each op's floating result moved by up to one unit in the last
place at random, a few samples; Verificarlo/Verrou's Monte Carlo arithmetic), and ``R`` is measured
against the reference. Limits: in-place random draws on a widened tensor (``uniform_``,
``nn.init.*``) draw in the cell's default dtype; a cell that inspects ``x.dtype`` sees float64; an
input tensor that is a view of another stops sharing its storage once widened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from neuron_workbench.compare.flatten import iter_leaves
from neuron_workbench.run.compile_check import eager_instrument
from neuron_workbench.run.executor import RunSpec, execute
from neuron_workbench.run.namespace import tensors_in
from neuron_workbench.run.random_draws import RANDOM_FACTORIES, RANDOM_IN_PLACE, original_function
from neuron_workbench.run.records import Run

__all__ = [
    "BUDGET_CLASSES",
    "JUDGES",
    "Budget",
    "OracleRuns",
    "BudgetClass",
    "OutputBudget",
    "measure_budget",
]

#: How a verdict judges floating outputs: by fixed tolerances, or by the precision budget.
JUDGES = ("tolerance", "budget")
#: Floor sources, as the report names them.
ORACLE = "float64 oracle"
RANDOM_ROUNDING = "random rounding"
#: Random-rounding samples when no oracle can be had.
ROUNDING_SAMPLES = 3

_LOW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_LOW_COMPLEX = (torch.complex32, torch.complex64)
# Draws whose dtype decides their numbers: drawn in the cell's dtype, widened afterwards.
_FLOAT_DRAWS = frozenset(
    original_function(f) for f in (torch.randn, torch.rand, torch.randn_like, torch.rand_like)
)
_CASTS = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})


@dataclass(frozen=True)
class BudgetClass:
    """One band of ``R``: up to ``limit`` (inclusive), its label, and whether it is within budget."""

    limit: float
    label: str
    within: bool


#: The bands of ``R``, in order (data, so they can be recalibrated): AWS's framework-equivalence
#: method passes up to 1.2 and calls 1.2-2 marginal.
BUDGET_CLASSES: tuple[BudgetClass, ...] = (
    BudgetClass(1.2, "as accurate as the reference", True),
    BudgetClass(2.0, "marginal", True),
    BudgetClass(math.inf, "less accurate", False),
)


def classify(ratio: float, classes: Sequence[BudgetClass] = BUDGET_CLASSES) -> BudgetClass:
    """The band ``ratio`` falls in (the last band for NaN)."""
    for band in classes:
        if ratio <= band.limit:
            return band
    return classes[-1]


@dataclass
class OutputBudget:
    """One floating output's noise floor and error ratio.

    Attributes
    ----------
    path : str
        The output leaf (as in :class:`~neuron_workbench.compare.OutputDiff`).
    source : str
        ``float64 oracle`` or ``random rounding`` (where no oracle could be had).
    floor, floor_worst : float
        ‖ref − oracle‖ (Frobenius) and the largest element of |ref − oracle|; with random rounding,
        the reference against its perturbed reruns. At least the output's own rounding to its dtype.
    error, error_worst : float
        The same for the target.
    ratio : float
        ``R = error / floor`` (1.0 when both are zero, ``inf`` when only the floor is).
    label : str
        The band's label (:data:`BUDGET_CLASSES`).
    within : bool
        Whether ``R`` is within budget.
    note : str
        Why the oracle could not be used for this output, when ``source`` is random rounding.
    histogram : dict or None
        The element-wise errors' distribution: ``edges`` (``HISTOGRAM_BINS + 1`` values of
        log10 |error|; exact elements count in the first bin) and the ``ref`` and ``target`` counts.
    """

    path: str
    source: str
    floor: float
    floor_worst: float
    error: float
    error_worst: float
    ratio: float
    label: str
    within: bool
    note: str = ""
    histogram: dict[str, list[float]] | None = None

    @property
    def factor(self) -> str:
        """``R`` as the report writes it: ``1.1``, ``38``, ``2.0e+06``; ``inf`` when the floor is zero."""
        if not math.isfinite(self.ratio):
            return "inf"
        if self.ratio < 10:
            return f"{self.ratio:.1f}"
        return f"{self.ratio:.0f}" if self.ratio < 1e4 else f"{self.ratio:.1e}"

    def describe(self) -> str:
        """``loss: target 38x less accurate than the reference`` or ``loss: R 1.1, marginal``."""
        if self.within:
            return f"{self.path}: R {self.factor}, {self.label}"
        if not math.isfinite(self.ratio):
            return f"{self.path}: target differs where the reference is exact (R inf)"
        return f"{self.path}: target {self.factor}x less accurate than the reference"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite numbers as strings)."""
        data = dataclasses.asdict(self)
        for key, value in list(data.items()):
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = str(value)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputBudget:
        """Inverse of :meth:`to_dict`."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("floor", "floor_worst", "error", "error_worst", "ratio"):
            values[key] = float(values[key])
        return cls(**values)


@dataclass
class Budget:
    """Every floating output's :class:`OutputBudget`, and how the floors were measured."""

    outputs: list[OutputBudget] = field(default_factory=list)
    #: Why the oracle run failed as a whole (random rounding then gave every floor), or "".
    oracle_error: str = ""
    #: ``--tol`` lines that would pass each output that failed its tolerance (see
    #: :func:`tolerance_lines`).
    tolerances: list[str] = field(default_factory=list)

    def get(self, path: str) -> OutputBudget | None:
        """The budget of output ``path``, or None when it has none (not floating, not measured)."""
        for output in self.outputs:
            if output.path == path:
                return output
        return None

    @property
    def worst(self) -> OutputBudget | None:
        """The output with the largest ``R``."""
        return max(self.outputs, key=lambda o: o.ratio, default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "outputs": [o.to_dict() for o in self.outputs],
            "oracle_error": self.oracle_error,
            "tolerances": list(self.tolerances),
            "classes": [
                {
                    "limit": str(c.limit) if math.isinf(c.limit) else c.limit,
                    "label": c.label,
                    "within": c.within,
                }
                for c in BUDGET_CLASSES
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Budget:
        """Inverse of :meth:`to_dict`."""
        return cls(
            [OutputBudget.from_dict(o) for o in data.get("outputs", [])],
            data.get("oracle_error", ""),
            list(data.get("tolerances", [])),
        )


#: How much looser than the tightest passing tolerance a suggested ``--tol`` is.
SAFETY_FACTOR = 2.0


def tolerance_lines(
    failures: Sequence[Any], budget: Budget | None = None, safety: float = SAFETY_FACTOR
) -> list[str]:
    """``--tol`` lines (``PATH=RTOL,ATOL``) that pass each output that failed its tolerance.

    Each keeps the output's ``rtol`` and loosens ``atol`` to ``safety`` times the tightest passing
    one (or keeps ``atol`` and loosens ``rtol`` when that is the smaller change). An output whose R is
    beyond budget is listed as a comment: a tolerance would hide a real difference.
    """
    lines = []
    for diff in failures:
        rtol, atol = diff.tolerance.rtol, diff.tolerance.atol
        options = []
        if diff.tight_atol is not None:
            options.append((rtol, diff.tight_atol * safety))
        if diff.tight_rtol is not None:
            options.append((diff.tight_rtol * safety, atol))
        if not options:
            continue
        new_rtol, new_atol = min(
            options, key=lambda pair: pair[0] / max(rtol, 1e-300) + pair[1] / max(atol, 1e-300)
        )
        line = f"--tol '{diff.path}={new_rtol:.1e},{new_atol:.1e}'"
        measured = budget.get(diff.path) if budget is not None else None
        if measured is not None and not measured.within:
            line = f"# {line}  (R {measured.factor}: beyond budget, a tolerance would hide it)"
        lines.append(line)
    return lines


# ---------------------------------------------------------------------------------------------
# The oracle run


def _low(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.dtype in (*_LOW_FLOATS, *_LOW_COMPLEX)


def _wide_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype in _LOW_FLOATS:
        return torch.float64
    if dtype in _LOW_COMPLEX:
        return torch.complex128
    return dtype


def _widen(value: Any) -> Any:
    if _low(value):
        return value.to(_wide_dtype(value.dtype))
    if isinstance(value, list | tuple) and any(_low(v) for v in value):
        return type(value)(_widen(v) for v in value)
    return value


def _widen_in_place(tensor: torch.Tensor) -> None:
    """Give ``tensor`` float64 storage in place: a model and its optimizer still share it.

    A view stops being one (its new storage is its own).
    """
    if _low(tensor):
        grad = tensor.grad if tensor.is_leaf else None
        tensor.data = tensor.data.to(_wide_dtype(tensor.dtype))
        if grad is not None and _low(grad):
            tensor.grad = grad.to(tensor.dtype)


def _narrow(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        return value.to(dtype)
    return value


class _Float64Promotion(TorchFunctionMode):
    """Computes every floating op in float64; random numbers are drawn in the cell's dtype first."""

    def __init__(self, draw_dtype: torch.dtype) -> None:
        super().__init__()
        self.draw_dtype = draw_dtype

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        base = original_function(func)
        if base in RANDOM_IN_PLACE:
            return self._draw_in_place(func, args, kwargs)
        if base in RANDOM_FACTORIES:
            return self._draw(base, func, args, kwargs)
        if func in _CASTS and args and isinstance(args[0], torch.Tensor):
            # on the cell's float32 tensor .float() is the tensor itself, .half() a new one
            tensor = args[0]
            if not (tensor.is_floating_point() or tensor.is_complex()):
                return tensor.to(torch.float64)  # .float() of a mask or of counts: a new float
            if func is torch.Tensor.float and tensor.dtype == torch.float64:
                return tensor
            return _widen(tensor) if _low(tensor) else tensor.clone()
        name = getattr(func, "__name__", "")
        in_place = (
            name.endswith("_")
            and not name.startswith("_")
            or name.startswith("__i")
            or name == "__setitem__"
        )
        if func is torch.Tensor.to and any(
            isinstance(a, torch.dtype) and a in _LOW_FLOATS and a != self.draw_dtype
            for a in (*args, kwargs.get("dtype"))
        ):
            kwargs["copy"] = True  # the cell's float32 tensor would have been converted, not kept
        if in_place and args and isinstance(args[0], torch.Tensor):
            _widen_in_place(args[0])
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            _widen_in_place(out)
        if isinstance(kwargs.get("dtype"), torch.dtype):
            kwargs["dtype"] = _wide_dtype(kwargs["dtype"])
        args = tuple(
            _wide_dtype(a)
            if isinstance(a, torch.dtype)
            else a
            if i == 0 and in_place
            else _widen(a)
            for i, a in enumerate(args)
        )
        kwargs = {k: v if k == "out" else _widen(v) for k, v in kwargs.items()}
        result = func(*args, **kwargs)
        # a float32 tensor made outside torch's factories (from NumPy, a buffer) joins in float64
        return _widen(result) if _low(result) else result

    def _draw(self, base: Any, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if base in _FLOAT_DRAWS or (
            base is original_function(torch.normal)
            and not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values()))
        ):
            if kwargs.get("dtype") is None:
                kwargs["dtype"] = self.draw_dtype
        else:  # probabilities, means, rates: the draws follow their dtype
            args = tuple(_narrow(a, self.draw_dtype) for a in args)
            kwargs = {k: _narrow(v, self.draw_dtype) for k, v in kwargs.items()}
        return _widen(func(*args, **kwargs))

    def _draw_in_place(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        # nn.init functions are dispatched with the tensor as a keyword
        keyword = not args
        target = kwargs.pop("tensor") if keyword else args[0]
        if not isinstance(target, torch.Tensor) or target.dtype != torch.float64:
            return func(target, *args[1:], **kwargs)
        drawn = torch.empty(target.shape, dtype=self.draw_dtype, device=target.device)
        func(drawn, *args[1:], **kwargs)
        # nn.init draws under no_grad; a plain Tensor.normal_ follows the caller's grad mode
        with torch.no_grad() if keyword or target.is_leaf else contextlib.nullcontext():
            target.copy_(drawn)
        return target


def oracle_instrument(spec: RunSpec) -> Callable[[Any], contextlib.AbstractContextManager[Any]]:
    """An instrument that runs the cell in float64 (see the module docstring).

    The run's private copies of its inputs are widened in place; objects the run shares with the
    namespace (that could not be copied) are left alone and promoted op by op.
    """
    namespace = spec.namespace
    originals = dict(namespace)

    @contextlib.contextmanager
    def instrument(backend: Any) -> Iterator[None]:
        draw_dtype = torch.get_default_dtype()
        for name, value in list(namespace.items()):
            if originals.get(name) is value:  # not this run's copy
                continue
            for tensor in tensors_in(value):
                _widen_in_place(tensor)
        torch.set_default_dtype(torch.float64)
        try:
            with _Float64Promotion(draw_dtype):
                yield None
        finally:
            torch.set_default_dtype(draw_dtype)

    return instrument


class _RandomRounding(TorchFunctionMode):
    """Moves each floating op result by up to one unit in the last place, at random.

    Adding less than half an ulp and rounding to nearest would change nothing, so the result is
    moved in float64 by up to a whole ulp and rounded back: it stays or goes to a neighbour.
    The noise comes from a private generator, so the cell's random numbers are untouched.
    """

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        # only fresh results: not an attribute read (x.grad), an argument, a view, a Parameter or
        # a leaf that collects gradients, whose identity the cell relies on
        if (
            type(result) is torch.Tensor
            and result.dtype in _LOW_FLOATS
            and result.numel()
            and not name.endswith("_")
            and name not in ("__get__", "__set__")
            and not result._is_view()
            and not (result.is_leaf and result.requires_grad)
            and not any(result is a for a in args)
        ):
            with torch.no_grad():
                wide = result.detach().to(torch.float64)
                noise = torch.rand(wide.shape, generator=self.generator, dtype=torch.float64)
                moved = wide + wide * (noise * 2 - 1) * torch.finfo(result.dtype).eps
                delta = moved.to(result.dtype) - result.detach()
            return result + delta  # gradients pass through unchanged
        return result


def _rounding_instrument(seed: int) -> Callable[[Any], contextlib.AbstractContextManager[Any]]:
    def instrument(backend: Any) -> contextlib.AbstractContextManager[Any]:
        return _RandomRounding(seed)

    return instrument


@dataclass
class OracleRuns:
    """The oracle's reruns of one cell, kept so further targets compared with it share them."""

    oracle: Run | None = None
    rounding: list[Run] | None = None


def _stopping(spec: RunSpec) -> dict[str, Any]:
    """The run's ``scalars`` instrument, for a rerun.

    It stops the rerun where ``max_steps`` stopped the runs, and the oracle's observed scalars
    give the first scalar divergence its ``R``.
    """
    scalars = spec.instruments.get("scalars")
    return {"scalars": scalars} if scalars is not None else {}


def _rerun(spec: RunSpec, backend: Any, instrument: Any) -> Run:
    """The cell once more on the reference path, with one instrument and its printing discarded."""
    rerun = RunSpec(
        spec.program,
        spec.namespace,
        seed=spec.seed,
        hidden=spec.hidden,
        resident=spec.resident,
        # compiled code runs eagerly: Dynamo would trace the promoting mode (the math is the same)
        instruments={"budget": instrument, **_stopping(spec), "compile_off": eager_instrument},
        rng_on_cpu=spec.rng_on_cpu,
        steps=spec.steps,
        isolate_inputs=spec.isolate_inputs,
        ref_precision=spec.ref_precision,
    )
    return execute(rerun, backend, run_id="oracle")


# ---------------------------------------------------------------------------------------------
# Measuring


def _float_leaf(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
        return value.detach()
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    return None


def _distance(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Frobenius norm and largest element of ``a − b`` over elements finite in both, in float64."""
    a = a.detach().cpu().to(torch.complex128 if a.is_complex() else torch.float64)
    b = b.detach().cpu().to(a.dtype)
    diff = (a - b).abs()
    finite = torch.isfinite(a) & torch.isfinite(b)
    diff = diff[finite]
    if not diff.numel():
        return 0.0, 0.0
    return float(torch.linalg.vector_norm(diff)), float(diff.max())


#: Bins of an output's error histogram.
HISTOGRAM_BINS = 24


def _errors(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| element-wise in float64, finite elements only, flattened."""
    a = a.detach().cpu().to(torch.complex128 if a.is_complex() else torch.float64)
    diff = (a - b.detach().cpu().to(a.dtype)).abs().flatten()
    return diff[torch.isfinite(diff)]


def error_histogram(ref: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]] | None:
    """Counts of log10 |error| of the reference and the target on shared bins (None if all exact)."""
    logs = []
    for errors in (ref, target):
        logs.append(torch.log10(errors.clamp_min(torch.finfo(torch.float64).tiny)))
    nonzero = torch.cat([lg[e > 0] for lg, e in zip(logs, (ref, target), strict=True)])
    if not nonzero.numel():
        return None
    low, high = float(nonzero.min()), float(nonzero.max())
    high = max(high, low + 1e-6)
    edges = torch.linspace(low, high, HISTOGRAM_BINS + 1, dtype=torch.float64)
    counts = [torch.histc(lg.clamp(low, high), HISTOGRAM_BINS, low, high).tolist() for lg in logs]
    return {"edges": edges.tolist(), "ref": counts[0], "target": counts[1]}


def _target_distance(
    ref: torch.Tensor, target: torch.Tensor, oracle: torch.Tensor
) -> tuple[float, float]:
    """The target's distance to the oracle; infinite where its NaN/Inf placement is not the ref's.

    Distances count finite elements only, so a NaN the reference does not have must not vanish.
    """
    if not torch.equal(torch.isfinite(ref.detach().cpu()), torch.isfinite(target.detach().cpu())):
        return math.inf, math.inf
    return _distance(target, oracle)


def _rounding_floor(oracle: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """The error of storing the oracle's value in the output's dtype: no run can do better."""
    if dtype == oracle.dtype:
        return 0.0, 0.0
    return _distance(oracle, oracle.to(dtype))


def _ratio(error: float, floor: float) -> float:
    if error == 0.0:
        return 1.0 if floor == 0.0 else 0.0
    return error / floor if floor > 0.0 else math.inf


def _output_budget(
    path: str, source: str, floor: tuple[float, float], error: tuple[float, float], note: str = ""
) -> OutputBudget:
    ratio = _ratio(error[0], floor[0])
    band = classify(ratio)
    return OutputBudget(
        path, source, floor[0], floor[1], error[0], error[1], ratio, band.label, band.within, note
    )


def _unpromoted(ref: torch.Tensor, oracle: Any) -> str:
    """Why ``oracle`` cannot serve as the float64 value of ``ref`` ("" when it can)."""
    leaf = _float_leaf(oracle)
    if leaf is None:
        return "the oracle run did not produce it as a floating value"
    if leaf.shape != ref.shape:
        return f"the oracle run gave shape {list(leaf.shape)}"
    if leaf.dtype not in (torch.float64, torch.complex128):
        return f"not promoted (the oracle computed it in {str(leaf.dtype).removeprefix('torch.')})"
    return ""


def measure_budget(
    spec: RunSpec,
    backend: Any,
    ref: Run,
    target: Run,
    paths: Sequence[str] | None = None,
    *,
    user_modules: Sequence[str] = ("__main__",),
    oracle: OracleRuns | None = None,
) -> Budget:
    """Rerun the cell as the float64 oracle and measure each floating output's floor and ``R``.

    Parameters
    ----------
    spec : RunSpec
        The spec both runs ran from, before anything was committed (the namespace as it was).
    backend : Backend
        The reference backend (the oracle runs on its path).
    ref, target : Run
        The finished runs.
    paths : sequence of str, optional
        Output leaves to measure (the failing ones); all floating outputs when None.
    user_modules : sequence of str
        As for :func:`~neuron_workbench.compare.flatten.iter_leaves`.
    oracle : OracleRuns, optional
        Reruns already made for this cell (filled in here when empty).

    Returns
    -------
    Budget
        One :class:`OutputBudget` per floating output leaf present in both runs with one shape.
    """
    ref_leaves = dict(iter_leaves(ref.outputs, user_modules=user_modules))
    target_leaves = dict(iter_leaves(target.outputs, user_modules=user_modules))
    wanted: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for path, value in ref_leaves.items():
        if paths is not None and path not in paths:
            continue
        a, b = _float_leaf(value), _float_leaf(target_leaves.get(path))
        if a is not None and b is not None and a.shape == b.shape:
            wanted[path] = (a, b)
    budget = Budget()
    if not wanted:
        return budget
    runs = oracle if oracle is not None else OracleRuns()
    if runs.oracle is None:
        runs.oracle = _rerun(spec, backend, oracle_instrument(spec))
    oracle_run = runs.oracle
    oracle_leaves: dict[str, Any] = {}
    if oracle_run.ok:
        oracle_run.outputs.update(
            {k: v for k, v in oracle_run.bindings.items() if k not in oracle_run.outputs}
        )
        oracle_leaves = dict(iter_leaves(oracle_run.outputs, user_modules=user_modules))
    else:
        assert oracle_run.error is not None
        budget.oracle_error = f"the float64 oracle run raised {oracle_run.error.summary}"
    fallback: dict[str, str] = {}
    for path, (a, b) in wanted.items():
        why = _unpromoted(a, oracle_leaves.get(path)) if oracle_run.ok else budget.oracle_error
        if why:
            fallback[path] = why
            continue
        oracle = _float_leaf(oracle_leaves[path])
        assert oracle is not None
        measured = _distance(a, oracle)
        least = _rounding_floor(oracle, a.dtype)
        floor = (max(measured[0], least[0]), max(measured[1], least[1]))
        measured_output = _output_budget(path, ORACLE, floor, _target_distance(a, b, oracle))
        measured_output.histogram = error_histogram(_errors(a, oracle), _errors(b, oracle))
        budget.outputs.append(measured_output)
    if fallback:
        if runs.rounding is None:
            runs.rounding = [
                _rerun(spec, backend, _rounding_instrument(sample))
                for sample in range(ROUNDING_SAMPLES)
            ]
        budget.outputs.extend(_rounding_budgets(runs.rounding, wanted, fallback, user_modules))
        order = list(wanted)
        budget.outputs.sort(key=lambda o: order.index(o.path))
    return budget


def _rounding_budgets(
    reruns: Sequence[Run],
    wanted: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    fallback: Mapping[str, str],
    user_modules: Sequence[str],
) -> list[OutputBudget]:
    """Floors from random-rounding reruns of the reference, for outputs the oracle could not give."""
    norms: dict[str, list[float]] = {path: [] for path in fallback}
    worst: dict[str, float] = dict.fromkeys(fallback, 0.0)
    first: dict[str, torch.Tensor] = {}
    for run in reruns:
        if not run.ok:
            continue
        run.outputs.update({k: v for k, v in run.bindings.items() if k not in run.outputs})
        leaves = dict(iter_leaves(run.outputs, user_modules=user_modules))
        for path in fallback:
            moved = _float_leaf(leaves.get(path))
            if moved is None or moved.shape != wanted[path][0].shape:
                continue
            norm, top = _distance(wanted[path][0], moved)
            first.setdefault(path, moved)
            norms[path].append(norm)
            worst[path] = max(worst[path], top)
    budgets = []
    for path, why in fallback.items():
        if not norms[path]:
            continue  # no floor at all: the output keeps its tolerance verdict only
        floor = (math.sqrt(sum(n * n for n in norms[path]) / len(norms[path])), worst[path])
        ref, target = wanted[path]
        error = _target_distance(ref, target, ref)
        measured = _output_budget(path, RANDOM_ROUNDING, floor, error, note=why)
        measured.histogram = error_histogram(_errors(ref, first[path]), _errors(target, ref))
        budgets.append(measured)
    return budgets
