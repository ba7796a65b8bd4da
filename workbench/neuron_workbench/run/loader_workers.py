"""A ``DataLoader`` whose persistent workers have started, copied or sent without them.

A loader with ``persistent_workers=True`` keeps its worker processes (and their random streams)
after its first epoch. Neither a deep copy nor a pickle can take processes along, so each run's
copy of such a loader (the reference's in the kernel, the target's in its worker) starts workers of
its own at its next epoch, both seeded alike from the original's base seed: the two runs' datasets
draw the same numbers in ``__getitem__`` (a random crop), and each cell's epoch draws new ones.
"""

from __future__ import annotations

import copyreg
import functools
from collections.abc import Callable
from typing import Any

import torch

_DATA_LOADER = torch.utils.data.DataLoader
_WORKERS = torch.utils.data.dataloader._MultiProcessingDataLoaderIter


def has_started_workers(value: Any) -> bool:
    """Whether ``value`` is a ``DataLoader`` holding the iterator of its persistent workers."""
    return isinstance(value, _DATA_LOADER) and isinstance(vars(value).get("_iterator"), _WORKERS)


def reduce_loader_past_its_workers(loader: torch.utils.data.DataLoader) -> Any:
    """``loader``'s reduction (for pickle and ``copy``) without its workers.

    The copy starts workers of its own when it is next iterated (see :func:`_first_iterator`).
    """
    state = {k: v for k, v in vars(loader).items() if k not in ("_iterator", "_get_iterator")}
    state["_iterator"] = None
    seed = vars(loader)["_iterator"]._base_seed
    return copyreg.__newobj__, (type(loader),), (state, seed), None, None, _loader_state_set


def loader_copied_past_its_workers(
    loader: torch.utils.data.DataLoader,
    memo: dict[int, Any],
    deepcopy: Callable[[Any, dict[int, Any]], Any],
) -> torch.utils.data.DataLoader:
    """A deep copy of ``loader`` (its state copied by ``deepcopy`` with ``memo``) without its workers.

    ``copy``'s own reconstruction takes no state setter, which the reduction needs.
    """
    make, arguments, state, _, _, set_state = reduce_loader_past_its_workers(loader)
    result = make(*arguments)
    memo[id(loader)] = result  # before its state: what the dataset holds may lead back to it
    set_state(result, deepcopy(state, memo))
    return result


def _loader_state_set(loader: torch.utils.data.DataLoader, state: Any) -> None:
    attributes, seed = state
    vars(loader).update(attributes)
    vars(loader)["_get_iterator"] = functools.partial(_first_iterator, loader, seed)


def _first_iterator(loader: torch.utils.data.DataLoader, seed: int) -> Any:
    """The copy's first iterator, its workers' base seed drawn from ``seed`` (the original's).

    The original goes on with the workers it has: its next epoch draws its shuffle but no base
    seed for workers. A fresh iterator draws one from the loader's generator (the notebook's random
    stream, by default), which would put this run's stream one draw ahead of plain code's; it draws
    it from a generator of its own instead. That generator is seeded with the original's base seed,
    so every run's copy draws the same new one, and the workers' random streams differ from the
    last epoch's.
    """
    del vars(loader)["_get_iterator"]  # later iterators are the class's own
    own = loader.generator
    # only the base seed reads loader.generator; the sampler holds the generator it was built with
    loader.generator = torch.Generator().manual_seed(seed)
    try:
        return loader._get_iterator()
    finally:
        loader.generator = own
