"""Random identifiers and seeds a cell draws from the system: the same in each run of the cell.

A cell naming its experiment ``run_id = uuid.uuid4().hex[:8]``, or seeding with ``torch.seed()``,
draws from the operating system, so the reference and the target bound two different texts (or
drew from two different seeds) and the cell failed, though the code is the same. During a run these
draw from the cell's own entropy instead: a fresh random key the kernel takes for each execution of
the cell (``RunSpec.entropy``) and sends to the target with the cell. Each run of a cell draws the
same values in the same order; the next execution of the cell draws new ones, as the notebook alone
would. The values come from a keyed BLAKE2b stream, as unpredictable as ``os.urandom``'s to anyone
without the key.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from neuron_workbench.run.patching import names_rebound, patched_attributes

__all__ = ["ENTROPY_BYTES", "drawn", "entropy_drawn_from", "new_entropy"]

#: The size of a cell's entropy (the key of its streams).
ENTROPY_BYTES = 16


def new_entropy() -> bytes:
    """A fresh key for one execution of a cell."""
    return os.urandom(ENTROPY_BYTES)


class _Streams:
    """One run's streams of random bytes, one per purpose (``uuid4``, ``torch.seed``)."""

    def __init__(self, entropy: bytes) -> None:
        self.entropy = entropy
        self.counts: collections.Counter[str] = collections.Counter()

    def draw(self, purpose: str, size: int) -> bytes:
        self.counts[purpose] += 1
        message = f"{purpose}:{self.counts[purpose]}".encode()
        return hashlib.blake2b(message, key=self.entropy, digest_size=size).digest()


#: The active runs' streams, the innermost run's last.
_ACTIVE: list[_Streams] = []


def drawn(purpose: str, size: int) -> bytes:
    """``size`` random bytes for ``purpose``: the active run's next, else the system's.

    Parameters
    ----------
    purpose : str
        What draws them (``"torch.seed"``): each purpose has its own stream, so one drawn more
        often in a run leaves the others' values as they are.
    size : int
        How many bytes (at most 64).
    """
    if not _ACTIVE:
        return os.urandom(size)
    return _ACTIVE[-1].draw(purpose, size)


def _uuid4() -> uuid.UUID:
    return uuid.UUID(bytes=drawn("uuid4", 16), version=4)


_uuid4.__doc__ = uuid.uuid4.__doc__


@contextlib.contextmanager
def entropy_drawn_from(
    entropy: bytes | None, namespace: MutableMapping[str, Any]
) -> Iterator[None]:
    """For the body: ``uuid.uuid4``, its names in ``namespace`` and :func:`drawn` use ``entropy``.

    ``from uuid import uuid4`` in an earlier cell bound the function itself: such a name draws from
    the run's too, and gets its own function back afterwards unless the cell bound it to something
    else. None: nothing changes.
    """
    if entropy is None:
        yield
        return
    original: Callable[[], uuid.UUID] = uuid.uuid4
    streams = _Streams(entropy)
    _ACTIVE.append(streams)
    try:
        with (
            names_rebound(namespace, lambda name, value: _uuid4 if value is original else value),
            patched_attributes(uuid, {"uuid4": _uuid4}),
        ):
            yield
    finally:
        _ACTIVE.remove(streams)
