"""Random identifiers a cell draws (``uuid.uuid4()``): the same in each run of the cell.

A cell naming its experiment ``run_id = uuid.uuid4().hex[:8]`` draws sixteen bytes from the
operating system, so the reference and the target bound two different texts and the cell failed,
though the code is the same. During a run, ``uuid4`` draws from the cell's own entropy instead: a
fresh random seed the kernel takes for each cell execution (``RunSpec.entropy``) and sends to the
target with the cell. Each run of a cell draws the same identifiers in the same order; the next
execution of the cell draws new ones, as the notebook alone would. The identifiers come from a
keyed BLAKE2b stream, as unpredictable as ``os.urandom``'s to anyone without the seed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from neuron_workbench.run.patching import patched_attributes

__all__ = ["ENTROPY_BYTES", "new_entropy", "uuids_drawn_from"]

#: The size of a cell's entropy (the key of its identifier stream).
ENTROPY_BYTES = 16


def new_entropy() -> bytes:
    """A fresh seed for one execution of a cell."""
    return os.urandom(ENTROPY_BYTES)


def _uuid4_from(entropy: bytes) -> Callable[[], uuid.UUID]:
    """A ``uuid4`` drawing its random bits from ``entropy``'s stream, in order."""
    drawn = [0]

    def uuid4() -> uuid.UUID:
        drawn[0] += 1
        digest = hashlib.blake2b(drawn[0].to_bytes(8, "little"), key=entropy, digest_size=16)
        return uuid.UUID(bytes=digest.digest(), version=4)

    uuid4.__doc__ = uuid.uuid4.__doc__
    return uuid4


@contextlib.contextmanager
def uuids_drawn_from(entropy: bytes | None, namespace: MutableMapping[str, Any]) -> Iterator[None]:
    """For the body: ``uuid.uuid4`` (and the namespace's own names for it) draw from ``entropy``.

    ``from uuid import uuid4`` in an earlier cell bound the function itself: such a name draws from
    the run's too, and gets its own function back afterwards unless the cell bound it to something
    else. None: ``uuid4`` is left as it is.
    """
    if entropy is None:
        yield
        return
    original = uuid.uuid4
    drawing = _uuid4_from(entropy)
    names = [name for name, value in namespace.items() if value is original]
    namespace.update(dict.fromkeys(names, drawing))
    try:
        with patched_attributes(uuid, {"uuid4": drawing}):
            yield
    finally:
        for name in names:
            if namespace.get(name) is drawing:
                namespace[name] = original
