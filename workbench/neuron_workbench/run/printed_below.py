"""What a target process's run writes below Python (to file descriptors 1 and 2), kept with it.

A worker inherits the standard output and error of the kernel (or of ``neuron-workbench run``):
``os.system("echo hi")``, a subprocess, or C code writing to fd 1 or 2 during the target run reached
the notebook (ipykernel forwards its process's fds) or the terminal, next to the same output of the
reference run, so a cell showed it twice. While a worker's run goes on, :func:`fds_to_files` points
fds 1 and 2 at files in the worker's folder; what lands there joins the run's captured ``stdout``
and ``stderr``, in the order it was written relative to the run's Python-level output (each Python
write first notes how far the file had grown). A worker that dies mid-run leaves the files for the
kernel to read (:func:`left_in`).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import sys
from collections.abc import Iterator

__all__ = ["PRINTED_PREFIX", "FdFile", "fds_to_files", "left_in"]

#: Names of the files a run's fd-level output goes to, in the worker's folder.
PRINTED_PREFIX = "printed-"

# The run patches os.open, os.unlink, ... to keep the target's file writes apart
# (run/file_writes.py): these files are the worker's own, so they go through the real functions.
_os_open = os.open
_os_unlink = os.unlink
_os_fstat = os.fstat
_os_listdir = os.listdir
_names = itertools.count()


def _flush_everything() -> None:
    """Push what Python and C hold buffered to the fds as they are now (before they change)."""
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    for stream in {id(s): s for s in streams}.values():
        with contextlib.suppress(Exception):  # closed, detached, None
            stream.flush()  # type: ignore[union-attr]
    with contextlib.suppress(Exception):  # C stdio's buffers (printf to a pipe or file)
        ctypes.CDLL(None).fflush(None)


class FdFile:
    """One file descriptor (1 or 2) pointed at a file of ``folder`` until :meth:`restore`.

    Parameters
    ----------
    fd : int
        The descriptor: 1 or 2.
    folder : str
        Where the file is made (the worker's own folder, which a crash leaves for the kernel).
    """

    def __init__(self, fd: int, folder: str) -> None:
        self.fd = fd
        name = "stdout" if fd == 1 else "stderr"
        self.path = os.path.join(folder, f"{PRINTED_PREFIX}{next(_names)}.{name}")
        # O_APPEND: every writer sharing it (a subprocess, a forked child) adds at the end
        self._file = _os_open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            self._saved: int | None = os.dup(fd)
        except OSError:  # the process was started with it closed: closed again afterwards
            self._saved = None
        os.dup2(self._file, fd)
        #: ``(python_bytes, fd_bytes)``: when Python's record held ``python_bytes``, this many
        #: bytes had reached the file (noted only when the file had grown).
        self._marks: list[tuple[int, int]] = []
        self._size = 0
        self._data: bytes | None = None

    def mark(self, python_bytes: int) -> None:
        """Note how far the file has grown, before Python's record grows past ``python_bytes``."""
        if self._data is not None:
            return  # restored: nothing more comes
        size = _os_fstat(self._file).st_size
        if size != self._size:
            self._marks.append((python_bytes, size))
            self._size = size

    def restore(self) -> None:
        """Point the fd back where it was, and keep what was written (the file goes)."""
        if self._data is not None:
            return
        if self._saved is None:
            os.close(self.fd)
        else:
            os.dup2(self._saved, self.fd)
            os.close(self._saved)
        size = _os_fstat(self._file).st_size
        chunks = []
        offset = 0
        while offset < size:
            chunk = os.pread(self._file, size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        self._data = b"".join(chunks)
        os.close(self._file)
        with contextlib.suppress(OSError):
            _os_unlink(self.path)

    def marked_end(self, python_bytes: int) -> int:
        """Where :meth:`merged`'s bytes end when Python's record holds ``python_bytes``.

        What reached the fd until now is noted (as by :meth:`mark`) and counted in.
        """
        self.mark(python_bytes)
        return python_bytes + self._size

    def merged(self, python: bytes) -> bytes:
        """``python`` (the run's Python-level bytes) with this fd's bytes where they came."""
        below = self._data or b""
        parts = []
        python_at = below_at = 0
        for python_end, below_end in self._marks:
            parts += [python[python_at:python_end], below[below_at:below_end]]
            python_at, below_at = python_end, below_end
        parts += [python[python_at:], below[below_at:]]
        return b"".join(parts)


@contextlib.contextmanager
def fds_to_files(folder: str) -> Iterator[tuple[FdFile, FdFile]]:
    """Point fds 1 and 2 at files of ``folder`` meanwhile; they are restored however it ends.

    What this process had buffered goes out first, where it was going; what the run buffered goes
    to the files before they are read (an interrupt or an error included).
    """
    _flush_everything()
    out = FdFile(1, folder)
    try:
        err = FdFile(2, folder)
    except BaseException:
        out.restore()
        raise
    try:
        yield out, err
    finally:
        _flush_everything()
        out.restore()
        err.restore()


def left_in(folder: str) -> tuple[str, str]:
    """What a process that died mid-run wrote to its fds 1 and 2 there: ``(stdout, stderr)``."""
    texts: dict[str, list[str]] = {"stdout": [], "stderr": []}
    try:
        names = sorted(
            (n for n in _os_listdir(folder) if n.startswith(PRINTED_PREFIX)),
            key=lambda n: int(n[len(PRINTED_PREFIX) :].split(".")[0]),
        )
    except (OSError, ValueError):
        return "", ""
    for name in names:
        kind = name.rsplit(".", 1)[-1]
        if kind in texts:
            with contextlib.suppress(OSError):
                with open(os.path.join(folder, name), "rb") as handle:
                    texts[kind].append(handle.read().decode("utf-8", errors="replace"))
    return "".join(texts["stdout"]), "".join(texts["stderr"])
