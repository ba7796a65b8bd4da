"""Objects the notebook holds that a run cannot copy: open files and progress bars.

``log = open("train.log", "w")`` or ``bar = tqdm(total=steps)`` in a plain cell, then a ``%%neuron``
cell that writes to the file or moves the bar: the cell runs twice, where a plain cell writes each
line once and moves the bar once. The run that is kept uses the notebook's object itself; every
other run (the target, the float64 oracle's rerun) gets a stand-in that takes what the run does
and holds it, as the files a run opens itself are kept apart
(:mod:`neuron_workbench.run.file_writes`). A target in its worker process always gets a stand-in
(the object cannot travel); when the target is the kept run, what it did is done to the
notebook's object in the kernel (:func:`write_back`).

Only files opened for writing alone (``"w"``, ``"a"``, ``"x"``, binary or text) with a path are
kept apart this way; a file also opened for reading (``"r+"``, ``"w+"``) is not. A bar's stand-in
counts ``update``s and keeps the last description and postfix; it does not iterate.
"""

from __future__ import annotations

import io
import os
import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FILE_TYPES",
    "HandleUses",
    "NotebookFileApart",
    "ProgressBarApart",
    "bar_kept_apart",
    "drain_made",
    "is_notebook_file",
    "kept_apart",
    "reduce_bar_for_sending",
    "reduce_for_sending",
    "sent",
    "write_back",
]

#: The types of what ``open()`` returns.
FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.FileIO)

#: The notebook's files and bars by the token they travelled under (this process's own, while alive).
_SENT: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
#: Stand-ins made since the last :func:`drain_made` (one run's, at a time).
_MADE: list[NotebookFileApart | ProgressBarApart] = []


def is_notebook_file(value: Any, *, open_only: bool = True) -> bool:
    """Whether ``value`` is a file on a path opened for writing and not for reading.

    With ``open_only`` (the default) it must be open as well.
    """
    if type(value) not in FILE_TYPES:
        return False
    try:
        if value.closed:
            mode = str(value.mode)
            return (
                not open_only
                and "r" not in mode
                and "+" not in mode
                and isinstance(value.name, str)
            )
        return value.writable() and not value.readable() and isinstance(value.name, str)
    except (ValueError, AttributeError):  # a detached wrapper
        return False


def token_of(handle: Any) -> str:
    """The token ``handle`` (a file, a bar) travels under; the process that sent it gets it back."""
    token = f"{os.getpid()}:{id(handle)}"
    _SENT[token] = handle
    return token


def sent(token: str) -> Any:
    """The notebook's file or bar sent under ``token`` by this process, or None."""
    return _SENT.get(token)


class NotebookFileApart:
    """What a run that is not kept writes to instead of one of the notebook's open files.

    It takes writes as the file would (text or bytes, ``print(..., file=log)``, ``csv.writer``,
    a ``logging.StreamHandler``) and holds them; ``name``, ``mode`` and ``encoding`` are the file's.
    It has no file descriptor: what would write to one directly (``os.write``) is refused.
    """

    def __init__(
        self, token: str, name: str, mode: str, encoding: str | None, errors: str | None
    ) -> None:
        self.token = token
        self.name = name
        self.mode = mode
        self.encoding = encoding
        self.errors = errors
        self._parts: list[Any] = []
        self.closed = False
        _MADE.append(self)

    @property
    def binary(self) -> bool:
        """Whether it takes bytes (its mode has ``b``)."""
        return "b" in self.mode

    def write(self, data: Any) -> int:
        """Hold ``data`` (``str``, or bytes-like in a binary mode); return its length."""
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self.binary:
            data = bytes(memoryview(data))
        elif not isinstance(data, str):
            raise TypeError(f"write() argument must be str, not {type(data).__name__}")
        self._parts.append(data)
        return len(data)

    def writelines(self, lines: Iterable[Any]) -> None:
        """Hold each of ``lines``, as :meth:`write` does."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Nothing to flush; as a file's, it refuses once closed."""
        if self.closed:
            raise ValueError("I/O operation on closed file.")

    def close(self) -> None:
        """Close the stand-in (the notebook's file is closed when this run is kept)."""
        self.closed = True

    def writable(self) -> bool:
        """True while open."""
        return not self.closed

    def readable(self) -> bool:
        """False: only files opened for writing alone get a stand-in."""
        return False

    def seekable(self) -> bool:
        """False: what was written before the cell is not here."""
        return False

    def isatty(self) -> bool:
        """False, as a file's."""
        return False

    def fileno(self) -> int:
        """Refused: a write through a descriptor would reach the notebook's file."""
        raise io.UnsupportedOperation(
            f"fileno: {self.name} is the notebook's open file, kept apart in this run"
        )

    def __enter__(self) -> NotebookFileApart:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> NotebookFileApart:
        raise io.UnsupportedOperation("not readable")

    def written(self) -> Any:
        """Everything written, in order (``str`` or ``bytes`` by the file's mode)."""
        return (b"" if self.binary else "").join(self._parts)

    def __repr__(self) -> str:
        return f"<the notebook's file {self.name!r} mode {self.mode!r}, kept apart in this run>"

    def __reduce__(self) -> Any:
        # back to the process that sent the file: its own file object (see transport)
        return _returned, (self.token, self.name, self.mode, self.encoding, self.errors)


def kept_apart(file: Any) -> NotebookFileApart:
    """A stand-in for the notebook's open ``file`` in a run that is not kept."""
    return NotebookFileApart(*_described(file))


def _described(file: Any) -> tuple[str, str, str, str | None, str | None]:
    """``file``'s token, path, mode (with ``b`` exactly when it takes bytes), encoding, errors."""
    mode = str(getattr(file, "mode", "w"))
    if isinstance(file, io.TextIOWrapper):
        mode = mode.replace("b", "")
    elif "b" not in mode:
        mode += "b"  # a FileIO's mode is "wb", a BufferedWriter's its raw file's
    return (
        token_of(file),
        file.name,
        mode,
        getattr(file, "encoding", None),
        getattr(file, "errors", None),
    )


def reduce_for_sending(file: Any) -> tuple[Any, tuple[Any, ...]]:
    """How the notebook's open ``file`` travels to a target process: as a stand-in there."""
    return _returned, _described(file)


def _returned(token: str, name: str, mode: str, encoding: str | None, errors: str | None) -> Any:
    """The file sent under ``token`` where it came from; a new stand-in anywhere else."""
    file = sent(token)
    return file if file is not None else NotebookFileApart(token, name, mode, encoding, errors)


def progress_bar_class() -> Any:
    """The progress bar class of tqdm where it is loaded (its notebook and asyncio bars subclass it)."""
    return getattr(sys.modules.get("tqdm.std"), "tqdm", None)


class ProgressBarApart:
    """What a run that is not kept moves instead of one of the notebook's progress bars.

    It counts ``update(n)`` (``n`` reads the bar's count as it goes) and keeps the last
    description and postfix; it draws nothing. ``write`` prints as ``tqdm.write`` does.
    """

    def __init__(self, token: str, n: float, total: float | None, desc: str) -> None:
        self.token = token
        self.n = n
        self.total = total
        self.desc = desc
        self.postfix: str | None = None
        self.moved = 0.0
        self.described = False
        self.disable = False
        self.closed = False
        _MADE.append(self)

    def update(self, n: float = 1) -> bool | None:
        """Count ``n`` more, as the bar would."""
        self.n += n
        self.moved += n
        return None

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        """Keep ``desc`` (with tqdm's ": "), for the notebook's bar when this run is kept."""
        self.set_description_str(f"{desc}: " if desc else "", refresh)

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        """Keep ``desc`` as it is."""
        self.desc = desc or ""
        self.described = True

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        """Keep the postfix tqdm would show (``loss=0.25``)."""
        items = dict(ordered_dict or {}, **kwargs)
        self.postfix = ", ".join(f"{key}={_postfix_value(value)}" for key, value in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Keep the postfix as it is."""
        self.postfix = str(s)

    def reset(self, total: float | None = None) -> None:
        """Start the count again (with a new total)."""
        self.moved -= self.n
        self.n = 0
        if total is not None:
            self.total = total

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to draw."""

    def clear(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to clear."""

    def display(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to draw."""

    def close(self) -> None:
        """Close the stand-in (the notebook's bar is closed when this run is kept)."""
        self.closed = True

    @staticmethod
    def write(s: str, file: Any = None, end: str = "\n", nolock: bool = False) -> None:
        """Print ``s`` as ``tqdm.write`` does (into the run's captured output)."""
        print(s, end=end, file=file if file is not None else sys.stdout)

    def __enter__(self) -> ProgressBarApart:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<the notebook's progress bar {self.desc!r} at {self.n}, kept apart in this run>"

    def __reduce__(self) -> Any:
        # back to the process that sent the bar: its own bar (see transport)
        return _bar_returned, (self.token, self.n, self.total, self.desc)


def _postfix_value(value: Any) -> str:
    """A postfix value as tqdm formats it (numbers short, ``3.14``, ``1e-05``)."""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def bar_kept_apart(bar: Any) -> ProgressBarApart:
    """A stand-in for the notebook's progress ``bar`` in a run that is not kept."""
    return ProgressBarApart(*_bar_described(bar))


def _bar_described(bar: Any) -> tuple[str, float, float | None, str]:
    return (
        token_of(bar),
        getattr(bar, "n", 0),
        getattr(bar, "total", None),
        getattr(bar, "desc", "") or "",
    )


def reduce_bar_for_sending(bar: Any) -> tuple[Any, tuple[Any, ...]]:
    """How the notebook's progress ``bar`` travels to a target process: as a stand-in there."""
    return _bar_returned, _bar_described(bar)


def _bar_returned(token: str, n: float, total: float | None, desc: str) -> Any:
    """The bar sent under ``token`` where it came from; a new stand-in anywhere else."""
    bar = sent(token)
    return bar if bar is not None else ProgressBarApart(token, n, total, desc)


@dataclass
class HandleUses:
    """What one run did to the stand-ins of the notebook's files and progress bars it was given."""

    #: ("file", token, path, what was written, closed) or ("bar", token, counted, description or
    #: None, postfix or None, closed), in the order the stand-ins were made
    uses: list[tuple[Any, ...]]

    @property
    def paths(self) -> list[str]:
        """The paths of the files written, each once."""
        return list(dict.fromkeys(os.path.abspath(use[2]) for use in self.uses if use[0] == "file"))


def drain_made() -> HandleUses:
    """What was done to the stand-ins made since the last call, and forget those stand-ins."""
    made = list(_MADE)
    _MADE.clear()
    uses: list[tuple[Any, ...]] = []
    for each in made:
        if isinstance(each, NotebookFileApart):
            if each._parts or each.closed:
                uses.append(("file", each.token, each.name, each.written(), each.closed))
        elif each.moved or each.described or each.postfix is not None or each.closed:
            description = each.desc if each.described else None
            uses.append(("bar", each.token, each.moved, description, each.postfix, each.closed))
    return HandleUses(uses)


def write_back(uses: Iterable[tuple[Any, ...]]) -> None:
    """Do to the notebook's files and bars what a kept run did to their stand-ins, here (the kernel).

    ``uses`` is :attr:`HandleUses.uses` of the run, as it came back from its process.
    """
    for use in uses:
        handle = sent(use[1])
        if handle is None:
            continue
        if use[0] == "file":
            _, _, _, data, closed = use
            if handle.closed:
                continue
            if data:
                handle.write(data)
            if closed:
                handle.close()
        else:
            _, _, counted, description, postfix, closed = use
            if description is not None:
                handle.set_description_str(description, refresh=False)
            if postfix is not None:
                handle.set_postfix_str(postfix, refresh=False)
            if counted:
                handle.update(counted)
            if closed:
                handle.close()
