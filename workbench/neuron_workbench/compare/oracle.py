"""The float64 oracle and random-rounding reruns the precision budget measures against.

The oracle is a **promoting function mode**, not shadow execution: the cell runs once more on the
reference path (CUDA semantics on the host, :func:`~neuron_workbench.run.executor.execute`) with the
run's inputs widened to float64, the default dtype float64, every floating tensor argument widened,
and every cast or ``dtype=`` to a lower floating dtype kept at float64. Random numbers are drawn in
the cell's own dtype and then widened, so the oracle sees the reference's draws. A mode was chosen
over shadow execution because the cell's control flow, modules and optimizers then run unchanged
and at plain float64 speed, with no tensor subclass to leak into user code.

Where no oracle can be had, a *random-rounding* rerun of the reference moves each op's floating
result by up to one unit in the last place at random (Verificarlo/Verrou's Monte Carlo arithmetic).
How the reruns become error ratios is :mod:`~neuron_workbench.compare.budget`'s.

Limits: in-place random draws on a widened tensor (``uniform_``, ``nn.init.*``) draw in the cell's
default dtype; a cell that inspects ``x.dtype`` sees float64; an input tensor that is a view of
another stops sharing its storage once widened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from neuron_workbench.run import logging_setup
from neuron_workbench.run.compile_check import eager_instrument
from neuron_workbench.run.executor import RunSpec, execute
from neuron_workbench.run.namespace import tensors_in
from neuron_workbench.run.random_draws import RANDOM_FACTORIES, RANDOM_IN_PLACE, original_function
from neuron_workbench.run.records import Run

_LOW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_LOW_COMPLEX = (torch.complex32, torch.complex64)
# Draws whose dtype decides their numbers: drawn in the cell's dtype, widened afterwards.
_FLOAT_DRAWS = frozenset(
    original_function(f) for f in (torch.randn, torch.rand, torch.randn_like, torch.rand_like)
)
_CASTS = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})


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
        float32_state = _AMP_FLOAT32_STATE.get(func)
        if float32_state is not None:
            return _with_float32_state(func, args, kwargs, *float32_state)
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


#: GradScaler's kernels take its scale, inverse scale and found-inf flag in float32 only ("inv_scale
#: must be a float tensor"), which the oracle made float64: by op, the positions of those tensors
#: and of the ones among them the op writes.
_AMP_FLOAT32_STATE: dict[Any, tuple[tuple[int, ...], tuple[int, ...]]] = {
    torch._amp_foreach_non_finite_check_and_unscale_: ((1, 2), (1,)),
    torch._amp_update_scale_: ((0, 2), (0,)),
}


def _with_float32_state(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    state: tuple[int, ...],
    written: tuple[int, ...],
) -> Any:
    """Call one of GradScaler's kernels with its state in float32, as it needs.

    The gradients it unscales stay float64; what it writes goes back into the oracle's tensors.
    """
    narrowed = list(args)
    for index in state:
        value = args[index]
        if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
            narrowed[index] = value.to(torch.float32)
    result = func(*narrowed, **kwargs)
    for index in written:
        if narrowed[index] is not args[index]:
            args[index].copy_(narrowed[index])
    return args[0] if result is narrowed[0] else result


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


def rounding_instrument(seed: int) -> Callable[[Any], contextlib.AbstractContextManager[Any]]:
    """The ``budget`` instrument of one random-rounding rerun (sample ``seed``)."""

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


def _optimizer_steps(spec: RunSpec) -> dict[str, Any]:
    """The run's ``optimizer`` instrument, for a rerun.

    The oracle's gradients at each ``step()`` judge a weight an Adam step moved beyond budget by
    the gradients that moved it (see ``Evidence.amplification_within_budget``).
    """
    optimizer = spec.instruments.get("optimizer")
    return {"optimizer": optimizer} if optimizer is not None else {}


def rerun(spec: RunSpec, backend: Any, instrument: Any) -> Run:
    """The cell once more on the reference path, with one instrument and its printing discarded."""
    again = RunSpec(
        spec.program,
        spec.namespace,
        seed=spec.seed,
        random_state=spec.random_state,
        hidden=spec.hidden,
        resident=spec.resident,
        # compiled code runs eagerly: Dynamo would trace the promoting mode (the math is the same)
        instruments={
            "budget": instrument,
            **_stopping(spec),
            **_optimizer_steps(spec),
            "compile_off": eager_instrument,
        },
        rng_on_cpu=spec.rng_on_cpu,
        steps=spec.steps,
        isolate_inputs=spec.isolate_inputs,
        ref_precision=spec.ref_precision,
        entropy=spec.entropy,
        kept_run=spec.kept_run,
        default_device=spec.default_device,
        torch_settings=spec.torch_settings,
        notebook_temp=spec.notebook_temp,
        originals=spec.originals,
    )
    # what it logs goes nowhere, as what it prints: the reference already wrote each message
    with logging_setup.records_go_nowhere():
        return execute(again, backend, run_id="oracle")
