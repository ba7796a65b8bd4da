"""Tensors a run changed in place without bumping their version counter.

A run's outputs include every name whose tensors changed in place, which the executor sees from
``Tensor._version`` (:func:`~neuron_workbench.run.namespace.version_signature`). Some of PyTorch's
own in-place kernels leave that counter alone: the fused optimizer steps
(``torch.optim.AdamW(..., fused=True)``, as CUDA code asks for, calls ``torch._fused_adamw_``) and
the gradient scaler's unscaling (``torch._amp_foreach_non_finite_check_and_unscale_``), whose
schemas write their tensor lists. A model trained by a fused optimizer in a cell that ends with
``zero_grad()`` then looked unchanged, so its weights were never compared. So do writes through
``.data``: ``p.data`` is an alias with a version counter of its own, so a hand-written EMA
(``ema_p.data.mul_(d).add_(p.data, alpha=1 - d)``), WGAN's weight clipping
(``p.data.clamp_(-c, c)``) or ``p.data = new`` changed ``p`` unseen.

:class:`UnversionedWrites` counts those writes per tensor while a run goes (the functions are
wrapped where the optimizers and ``GradScaler`` look them up, on the ``torch`` module: no cost per
op), and :func:`~neuron_workbench.run.namespace.version_signature` adds the counts to the
tensors' versions. Nothing about the tensors themselves changes: autograd sees what it sees on a
GPU. The ``.data`` aliases a run takes are reported by the run's remap
(:meth:`UnversionedWrites.aliased`, :meth:`UnversionedWrites.wrote`): their own version counters
tell which ones were written.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from neuron_workbench.dispatch_calls import UNVERSIONED_WRITERS
from neuron_workbench.run.patching import patched_attributes

__all__ = ["UNVERSIONED_WRITERS", "UnversionedWrites"]


#: How many ``.data`` aliases are held before the first look at which of them can go.
_FIRST_SWEEP = 256


class UnversionedWrites:
    """How many times a run's unversioned in-place kernels wrote each tensor.

    Only the tensors alive when :meth:`count` asks are answered for (a weak reference checks that
    an id still names the tensor that was written).
    """

    def __init__(self) -> None:
        self._counts: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        # the .data aliases taken, by id: the alias, the tensor it aliases, its version counted
        self._aliases: dict[int, tuple[torch.Tensor, weakref.ref[torch.Tensor], int]] = {}
        self._sweep_at = _FIRST_SWEEP
        # the tensors whose .data aliases are followed: the state the run started with
        self._watched: dict[int, weakref.ref[torch.Tensor]] = {}

    def watch(self, tensors: Iterable[torch.Tensor]) -> None:
        """Follow the ``.data`` aliases of ``tensors`` (and of their gradients).

        Only the state a run started with can change unseen: a tensor the run made is an output by
        its name. An alias of any other tensor (``outputs.data`` in an evaluation loop) is not
        kept, so it holds no memory.
        """
        for tensor in tensors:
            grad = tensor.grad if tensor.is_leaf else None
            for item in (tensor, grad):
                if isinstance(item, torch.Tensor):
                    self._watched[id(item)] = weakref.ref(item)

    def aliased(self, tensor: torch.Tensor, alias: Any) -> None:
        """``alias`` is ``tensor.data``: what is written through it is written to ``tensor``."""
        if not isinstance(alias, torch.Tensor) or alias is tensor:
            return
        entry = self._aliases.get(id(tensor))
        if entry is not None and entry[0] is tensor:  # p.data.data: the tensor aliased first
            source = entry[1]
        else:
            watched = self._watched.get(id(tensor))
            if watched is None or watched() is not tensor:
                return
            source = watched
        self._aliases[id(alias)] = (alias, source, alias._version)
        if len(self._aliases) >= self._sweep_at:
            self._fold()
            self._sweep_at = max(_FIRST_SWEEP, 2 * len(self._aliases))

    def wrote(self, value: Any) -> None:
        """Count one write of ``value``: a tensor, or a list or tuple of them."""
        tensors = value if isinstance(value, list | tuple) else (value,)
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            entry = self._counts.get(id(tensor))
            count = entry[1] if entry is not None and entry[0]() is tensor else 0
            self._counts[id(tensor)] = (weakref.ref(tensor), count + 1)

    def replaced(self, tensor: torch.Tensor) -> None:
        """``tensor.data = new``: one write; its aliases from before view memory it no longer has."""
        if self._aliases:
            self._fold()
            for key in [k for k, entry in self._aliases.items() if entry[1]() is tensor]:
                del self._aliases[key]
        self.wrote(tensor)

    def count(self, tensor: torch.Tensor) -> int:
        """The writes of ``tensor`` the run's version counters did not count."""
        if self._aliases:
            self._fold()
        entry = self._counts.get(id(tensor))
        return entry[1] if entry is not None and entry[0]() is tensor else 0

    def _fold(self) -> None:
        """Count the writes made through ``.data`` aliases; forget the aliases no one else holds.

        An alias only this object holds can be written no more: its count is final.
        """
        for key in list(self._aliases):
            source, counted = self._aliases[key][1:]
            tensor = source()
            if tensor is None:
                del self._aliases[key]
                continue
            version = self._aliases[key][0]._version
            if version != counted:
                entry = self._counts.get(id(tensor))
                count = entry[1] if entry is not None and entry[0]() is tensor else 0
                self._counts[id(tensor)] = (source, count + version - counted)
                self._aliases[key] = (self._aliases[key][0], source, version)
            # held by its entry and getrefcount's argument alone
            if sys.getrefcount(self._aliases[key][0]) <= 2:
                del self._aliases[key]

    @contextlib.contextmanager
    def recording(self) -> Iterator[UnversionedWrites]:
        """Count the writes of :data:`UNVERSIONED_WRITERS` made in the body."""
        replacements = {
            name: self._counting(getattr(torch, name), positions)
            for name, positions in UNVERSIONED_WRITERS.items()
            if hasattr(torch, name)
        }
        with patched_attributes(torch, replacements):
            yield self

    def _counting(
        self, function: Callable[..., Any], positions: tuple[int, ...]
    ) -> Callable[..., Any]:
        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():  # a compiled step: AOTAutograd bumps the versions
                return function(*args, **kwargs)
            result = function(*args, **kwargs)
            for position in positions:
                if position < len(args):
                    self.wrote(args[position])
            return result

        return counted
