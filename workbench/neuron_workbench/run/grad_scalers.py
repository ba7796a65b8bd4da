"""A ``GradScaler``'s copy keeps the scale it had, as the notebook's scaler does.

``GradScaler.__getstate__`` (which ``copy.deepcopy`` and pickle use) drops the scale and growth
tracker tensors, keeping their values in ``_init_scale`` and ``_init_growth_tracker`` for
``scale()`` to make them again. Each run works on a copy, so gradient accumulation split over
cells (``scaler.scale(loss).backward()`` in a cell run once per micro-batch, ``scaler.step(opt);
scaler.update()`` in the next) stopped both runs at ``step`` with torch's "Attempted step but
_scale is None. This may indicate your script did not use scaler.scale(loss or outputs)", where
the plain notebook, which copies nothing, steps.

The workbench's copies (:func:`grad_scaler_state`, for its deep copies and its transfers to a
worker) mark a scaler whose scale they dropped; in a run (:func:`scales_made_again`), such a copy
makes its scale again, with the values it had, where its optimizer's parameters are, when
``unscale_`` or ``step`` first needs it (as ``scale()`` makes it where its outputs are). A scaler
that never scaled is not marked and fails as it does without the workbench.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run.patching import patched_attributes

__all__ = [
    "SCALE_DROPPED",
    "ScalerMidStep",
    "deepcopy_grad_scaler",
    "grad_scaler_state",
    "mid_step_message",
    "scales_made_again",
]

#: Set in the state of a copied ``GradScaler`` whose scale the copy dropped.
SCALE_DROPPED = "_neuron_workbench_scale_dropped"

GRAD_SCALER = torch.amp.GradScaler


class ScalerMidStep(WorkbenchUsageError):
    """A ``GradScaler`` between ``unscale_`` and ``step``: it cannot be copied for a run."""


def mid_step_message(name: str) -> str:
    """The line that stops a cell reading ``name``, a scaler between ``unscale_`` and ``step``."""
    return (
        f"{name!r} is a GradScaler between unscale_ and step (or between step and update), which "
        f"cannot be copied for a run (its own pickling refuses it, and runs sharing it would "
        f"unscale the gradients twice); keep scaler.unscale_(optimizer), scaler.step(optimizer) "
        f"and scaler.update() in one %%neuron cell"
    )


def grad_scaler_state(scaler: Any) -> dict[str, Any]:
    """``scaler.__getstate__()``, marked with :data:`SCALE_DROPPED` where it dropped a scale.

    Raises :class:`ScalerMidStep` for a scaler between ``unscale_`` and ``step``, or ``step``
    and ``update`` (its per-optimizer states are set), which ``__getstate__`` refuses.
    """
    if scaler._enabled and scaler._per_optimizer_states:
        raise ScalerMidStep(
            "a GradScaler between unscale_ and step (or step and update) cannot be copied"
        )
    state = scaler.__getstate__()
    if scaler._enabled and scaler._scale is not None:
        state[SCALE_DROPPED] = True
    return state


def deepcopy_grad_scaler(scaler: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(scaler)`` as PyTorch's, marked as :func:`grad_scaler_state` marks it."""
    result = object.__new__(type(scaler))
    memo[id(scaler)] = result
    result.__setstate__(copy.deepcopy(grad_scaler_state(scaler), memo))
    return result


def _first_parameter_device(optimizer: Any) -> torch.device | None:
    for group in getattr(optimizer, "param_groups", ()):
        for param in group.get("params", ()):
            if isinstance(param, torch.Tensor):
                return param.device
    return None


def _making_scale_again(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if vars(self).pop(SCALE_DROPPED, False) and self._enabled and self._scale is None:
            device = _first_parameter_device(optimizer)
            if device is not None:
                self._lazy_init_scale_growth_tracker(device)
        return method(self, optimizer, *args, **kwargs)

    return wrapper


def _forgetting_mark(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        vars(self).pop(SCALE_DROPPED, None)  # scale() makes it where its outputs are
        return method(self, *args, **kwargs)

    return wrapper


@contextlib.contextmanager
def scales_made_again() -> Iterator[None]:
    """In the body, a copied scaler makes the scale its copy dropped where it first needs it."""
    own = vars(GRAD_SCALER)
    with patched_attributes(
        GRAD_SCALER,
        {
            "unscale_": _making_scale_again(own["unscale_"]),
            "step": _making_scale_again(own["step"]),
            "scale": _forgetting_mark(own["scale"]),
        },
    ):
        yield
