"""Setting attributes of a module or class for the length of a run, and putting them back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["patched_attributes"]


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
