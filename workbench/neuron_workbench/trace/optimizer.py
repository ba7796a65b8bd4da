"""What each ``optimizer.step()`` of a run saw: gradients and second moments, at the step.

Gradients are read in a global step pre-hook, so ``zero_grad(set_to_none=True)`` after the step
cannot hide them. A weight that differs after a step whose gradients matched points at the
optimizer itself (Adam-style updates divide by ``sqrt(v) + eps`` and magnify small gradient
differences where ``v`` is tiny); the report's hints use this record as their evidence.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

#: Above this many parameter elements per step, nothing is copied (memory would double).
MAX_ELEMENTS = 20_000_000

#: Optimizers whose update divides by ``sqrt(second moment) + eps``.
DIVIDES_BY_SQRT_V = frozenset(
    {"Adam", "AdamW", "NAdam", "RAdam", "Adamax", "Adagrad", "RMSprop", "Adadelta", "SparseAdam"}
)


@dataclass
class ParamAtStep:
    """One parameter at the last ``step()`` of its optimizer (host copies, float32 or wider)."""

    optimizer: str
    ordinal: int
    index: int
    grad: torch.Tensor | None
    second_moment: torch.Tensor | None
    step: int
    lr: float
    eps: float | None
    beta1: float | None
    beta2: float | None
    #: The group's ``weight_decay`` (Adam adds ``weight_decay * p`` to the gradient; AdamW does not).
    weight_decay: float | None = None

    def update_sensitivity(self, index: tuple[int, ...]) -> float | None:
        """How much one unit of gradient difference moves this element's update (Adam-style).

        ``lr * (1 - beta1) / (1 - beta1**t) / (sqrt(v_hat) + eps)`` with ``v_hat`` the bias-corrected
        second moment after the step, or ``lr * eps / (|g| + eps)**2`` on the first step (where
        ``m_hat = g`` and ``v_hat = g**2``, so the update is ``lr * g / (|g| + eps)``).
        """
        if self.grad is None or self.eps is None or self.optimizer not in DIVIDES_BY_SQRT_V:
            return None
        g = abs(float(self.grad[index]))
        beta1 = self.beta1 if self.beta1 is not None else 0.9
        beta2 = self.beta2 if self.beta2 is not None else 0.999
        t = self.step + 1
        if self.step == 0 or self.second_moment is None:
            return self.lr * self.eps / (g + self.eps) ** 2
        v = beta2 * float(self.second_moment[index]) + (1 - beta2) * g * g
        v_hat = v / (1 - beta2**t)
        return self.lr * (1 - beta1) / (1 - beta1**t) / (math.sqrt(v_hat) + self.eps)


@dataclass
class OptimizerSteps:
    """Every parameter's state at its optimizer's last step in one run.

    A target process's record travels without its host copies (:meth:`hold_copies`): they are
    read only to explain a failure, and can weigh as much as the model twice over. The kernel gives
    the record a way to fetch them (:meth:`fetch_copies_with`); :meth:`at_step` fetches them on
    first use, and a record whose copies cannot be fetched any more answers without them.
    """

    calls: int = 0
    skipped: str = ""
    params: dict[int, tuple[Any, ParamAtStep]] = field(default_factory=dict, repr=False)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    #: The token of the copies a target process kept (``""``: the copies are here).
    held: str = ""
    _fetch: Callable[[str], Any] | None = field(default=None, repr=False, compare=False)
    #: The records by :func:`_view_of_memory` of their parameters (built on first use).
    _aliases: dict[tuple[Any, ...], tuple[Any, ParamAtStep]] | None = field(
        default=None, repr=False, compare=False
    )

    def at_step(self, param: Any) -> ParamAtStep | None:
        """The record of ``param`` (the very tensor object, or an alias of it), or None.

        An alias is the same view of the same memory (``model.state_dict()``'s detached tensors
        in a checkpoint dict, ``p.data``, ``p.detach()``): it holds the parameter's values, so it
        is judged by the parameter's step. A copy is not an alias.
        """
        entry = self.params.get(id(param))
        if entry is None or entry[0] is not param:
            key = _view_of_memory(param)
            if key is None:
                return None
            if self._aliases is None:
                views = ((_view_of_memory(p), (p, r)) for p, r in self.params.values())
                self._aliases = {view: entry for view, entry in views if view is not None}
            entry = self._aliases.get(key)
            if entry is None:
                return None
        if self.held:
            self._take_held_copies()
        return entry[1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no tensors)."""
        return {"calls": self.calls, "optimizers": list(self.optimizers), "skipped": self.skipped}

    def hold_copies(self, token: str) -> dict[tuple[int, int], tuple[Any, Any]]:
        """Take the host copies out of the records (a target process keeps them under ``token``).

        Returns them by ``(optimizer ordinal, parameter index)``.
        """
        copies = {}
        for _, record in self.params.values():
            copies[(record.ordinal, record.index)] = (record.grad, record.second_moment)
            record.grad = record.second_moment = None
        self.held = token
        return copies

    def fetch_copies_with(self, fetch: Callable[[str], Any]) -> None:
        """Set how the held copies are fetched: ``fetch(token)`` returns :meth:`hold_copies`' dict."""
        self._fetch = fetch

    def _take_held_copies(self) -> None:
        fetch, token = self._fetch, self.held
        self.held, self._fetch = "", None
        copies: dict[tuple[int, int], tuple[Any, Any]] = {}
        if fetch is not None:
            try:
                copies = fetch(token) or {}
            except Exception:  # the process is gone or busy: hints go without this evidence
                copies = {}
        for _, record in self.params.values():
            record.grad, record.second_moment = copies.get(
                (record.ordinal, record.index), (None, None)
            )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fetch"] = None  # a way back to one process, not data
        state["_aliases"] = None  # (by addresses in this process)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Rebuilt in another process (a worker's run): the keys are the parameters' new ids there.
        self.__dict__.update(state)
        self.__dict__.setdefault("held", "")
        self.__dict__.setdefault("_fetch", None)
        self._aliases = None
        self.params = {id(param): (param, record) for param, record in self.params.values()}


def _view_of_memory(value: Any) -> tuple[Any, ...] | None:
    """What makes two tensors the same view of the same memory, or None (not a plain tensor)."""
    if not isinstance(value, torch.Tensor) or value.is_sparse or value.device.type == "meta":
        return None
    try:
        address = value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor subclass or wrapper without storage
        return None
    if address == 0:
        return None  # no memory of its own (an empty tensor)
    shape, stride = tuple(value.shape), value.stride()
    return (value.device, address, value.storage_offset(), shape, stride, value.dtype)


class OptimizerRecorder:
    """Records :class:`OptimizerSteps` while active (a run instrument)."""

    def __init__(self) -> None:
        self._steps = OptimizerSteps()
        self._ordinals: dict[int, int] = {}

    def result(self) -> OptimizerSteps:
        """What was recorded."""
        return self._steps

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if torch.compiler.is_compiling():
            # opt.step() inside a compiled function: Dynamo traces this hook too, and recording
            # would break the cell's graph where a plain run's is whole (at torch's mode stack).
            # The step is not recorded; its weights are judged as any other value.
            return
        # Without the run's torch function modes: the reads and copies are the recorder's own (a
        # mode would remap, tag and note every one of them, at the cost of a few ms per step).
        with _no_function_modes():
            self._record(optimizer)

    def _record(self, optimizer: torch.optim.Optimizer) -> None:
        from torch.utils._python_dispatch import _disable_current_modes

        steps = self._steps
        steps.calls += 1
        ordinal = self._ordinals.setdefault(id(optimizer), len(self._ordinals))
        name = type(optimizer).__name__
        params = [(g, p) for g in optimizer.param_groups for p in g["params"]]
        if sum(p.numel() for _, p in params) > MAX_ELEMENTS:
            steps.skipped = f"{name} has over {MAX_ELEMENTS:,} parameter elements: not copied"
            return
        if ordinal == len(steps.optimizers):
            group = optimizer.param_groups[0] if optimizer.param_groups else {}
            steps.optimizers.append(
                {"type": name, **{k: _plain(group.get(k)) for k in ("lr", "eps", "betas")}}
            )
        with _disable_current_modes(), torch.no_grad():
            for index, (group, param) in enumerate(params):
                state = optimizer.state.get(param, {})
                second = state.get("exp_avg_sq", state.get("square_avg"))
                betas = group.get("betas") or (None, None)
                steps.params[id(param)] = (
                    param,
                    ParamAtStep(
                        optimizer=name,
                        ordinal=ordinal,
                        index=index,
                        grad=_host_copy(param.grad),
                        second_moment=_host_copy(second),
                        step=int(_plain(state.get("step", 0)) or 0),
                        lr=float(_plain(group.get("lr", 0.0)) or 0.0),
                        eps=_optional_float(group.get("eps")),
                        beta1=_optional_float(betas[0]),
                        beta2=_optional_float(betas[1]),
                        weight_decay=_optional_float(group.get("weight_decay")),
                    ),
                )

    @contextlib.contextmanager
    def recording(self) -> Iterator[OptimizerRecorder]:
        """Install the global step pre-hook for the body."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        handle = register_optimizer_step_pre_hook(self._pre_step)
        try:
            yield self
        finally:
            handle.remove()


@contextlib.contextmanager
def _no_function_modes() -> Iterator[None]:
    """No torch function mode for the body (each is put back, in order, afterwards)."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

    modes = _get_current_function_mode_stack()
    for _ in modes:
        _pop_mode()
    try:
        yield
    finally:
        for mode in modes:
            _push_mode(mode)


def optimizer_instrument(backend: Any) -> contextlib.AbstractContextManager[OptimizerRecorder]:
    """Run instrument (see ``run.executor.Instrument``) recording every optimizer step."""
    return OptimizerRecorder().recording()


def _host_copy(tensor: Any) -> torch.Tensor | None:
    if not isinstance(tensor, torch.Tensor) or tensor.is_sparse:
        return None
    copy = tensor.detach().to("cpu", copy=True)
    return copy.float() if copy.dtype in (torch.float16, torch.bfloat16) else copy


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _optional_float(value: Any) -> float | None:
    value = _plain(value)
    return float(value) if isinstance(value, int | float) else None
