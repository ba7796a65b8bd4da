"""Files the notebook holds open for writing (``log = open("train.log", "w")`` in a plain cell).

A ``%%neuron`` cell that writes to such a file runs twice; in a plain cell its lines are written
once. The run that is kept writes to the notebook's file itself; every other run (the target, the
float64 oracle's rerun) gets a :func:`kept_apart` stand-in that takes the writes and holds them, as
the files a run opens itself are kept apart (:mod:`neuron_workbench.run.file_writes`). A target in
its worker process always gets a stand-in (the file cannot travel); when the target is the kept
run, what it wrote is written to the notebook's file in the kernel (:func:`write_back`).

Only files opened for writing alone (``"w"``, ``"a"``, ``"x"``, binary or text) with a path are
kept apart this way; a file also opened for reading (``"r+"``, ``"w+"``) is not.
"""

from __future__ import annotations

import io
import os
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FILE_TYPES",
    "FileWrites",
    "NotebookFileApart",
    "drain_made",
    "is_notebook_file",
    "kept_apart",
    "reduce_for_sending",
    "sent",
    "write_back",
]

#: The types of what ``open()`` returns.
FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.FileIO)

#: The notebook's files by the token they travelled under (this process's own, kept while open).
_SENT: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
#: Stand-ins made since the last :func:`drain_made` (one run's, at a time).
_MADE: list[NotebookFileApart] = []


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


def token_of(file: Any) -> str:
    """The token ``file`` travels under; the process that sent it gets it back by it."""
    token = f"{os.getpid()}:{id(file)}"
    _SENT[token] = file
    return token


def sent(token: str) -> Any:
    """The notebook's file sent under ``token`` by this process, or None."""
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


@dataclass
class FileWrites:
    """What one run wrote to the notebook's open files it was given as stand-ins."""

    #: (token, path, what was written, whether the run closed it), in the order first written
    writes: list[tuple[str, str, Any, bool]]

    @property
    def paths(self) -> list[str]:
        """The files' paths, each once."""
        return list(dict.fromkeys(os.path.abspath(path) for _, path, _, _ in self.writes))


def drain_made() -> FileWrites:
    """The writes to the stand-ins made since the last call, and forget those stand-ins."""
    made = list(_MADE)
    _MADE.clear()
    return FileWrites(
        [(f.token, f.name, f.written(), f.closed) for f in made if f._parts or f.closed]
    )


def write_back(writes: Iterable[tuple[str, str, Any, bool]]) -> None:
    """Write what a kept run wrote to stand-ins into the notebook's files, here (the kernel).

    ``writes`` is :attr:`FileWrites.writes` of the run, as it came back from its process.
    """
    for token, _path, data, closed in writes:
        file = sent(token)
        if file is None or file.closed:
            continue
        if data:
            file.write(data)
        if closed:
            file.close()
