"""Setting attributes of a module or class for the length of a run, and putting them back."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

__all__ = ["loaded_modules_under", "names_rebound", "patched_attributes"]

#: Per package prefix: how many modules were loaded when it was last looked for, and its modules.
_UNDER: dict[str, tuple[int, tuple[types.ModuleType, ...]]] = {}


def loaded_modules_under(prefix: str) -> tuple[types.ModuleType, ...]:
    """The loaded modules whose names start with ``prefix`` (``"torch.optim."``).

    Looked for again only when ``sys.modules`` has grown or shrunk since the last look: a notebook
    with transformers has thousands of modules, and the run-by-run callers want a few of them.
    """
    count = len(sys.modules)
    seen = _UNDER.get(prefix)
    if seen is None or seen[0] != count:
        found = tuple(
            module
            for name, module in list(sys.modules.items())
            if name.startswith(prefix) and isinstance(module, types.ModuleType)
        )
        seen = _UNDER[prefix] = (count, found)
    return seen[1]


@contextlib.contextmanager
def patched_attributes(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
    """Set attributes of ``owner`` for the body; put back (or delete) each one afterwards.

    An attribute ``owner`` only inherits (``torch.Tensor.item`` from its C base) is deleted again,
    not copied into ``owner``'s own namespace.
    """
    missing = object()
    try:
        own = vars(owner)
    except TypeError:  # no __dict__: what getattr finds is its own
        own = None
    saved = {
        name: own.get(name, missing) if own is not None else getattr(owner, name, missing)
        for name in replacements
    }
    try:
        for name, value in replacements.items():
            setattr(owner, name, value)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@contextlib.contextmanager
def names_rebound(
    namespace: MutableMapping[str, Any], meaning: Callable[[str, Any], Any]
) -> Iterator[None]:
    """For the body: each name of ``namespace`` whose value ``meaning`` replaces holds the new one.

    ``meaning(name, value)`` gives the value the name holds during the body, or ``value`` itself
    to leave it. Afterwards each name still holding its replacement gets its own value back; one
    the body bound to something else keeps that (``from time import perf_counter`` in the
    notebook: the run's tagged timer for the body, the notebook's function after it).
    """
    bound = {}
    for name, value in list(namespace.items()):
        meant = meaning(name, value)
        if meant is not value:
            bound[name] = (value, meant)
    namespace.update({name: meant for name, (_, meant) in bound.items()})
    try:
        yield
    finally:
        for name, (original, meant) in bound.items():
            if namespace.get(name) is meant:
                namespace[name] = original
