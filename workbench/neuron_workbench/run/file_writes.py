"""Files a run writes that must not reach the notebook's: every run but the kept one.

A ``%%neuron`` cell runs twice, and on the default path both runs go at the same time. A cell that
saves a checkpoint (``torch.save(model.state_dict(), "ckpt.pt")``) had both runs write the same file:
whichever finished last won, so after the cell the file could hold the target's storages, tagged
``neuron:0``, which the kernel (no device) cannot load. The namespace holds the kept run's results
(the reference's unless ``--keep target``), and so must the files.

While :func:`writes_kept_apart` is active, Python-level opens for writing (``open``/``io.open``,
which NumPy, pandas, ``pickle`` to a file, ``json``, matplotlib and ``pathlib`` use, and
``torch.save``'s zip writer; ``torch.load(path, mmap=True)`` too)
go to a private folder instead of the named file, and the run reads back what it wrote from there;
``os.replace``/``os.rename``/``os.remove``/``os.unlink`` and ``os.stat`` (so ``os.path.exists``)
follow the files it wrote. Files it did not write read as they are. Not covered: writes made below
Python (``safetensors``' Rust writer, HDF5), and other processes reading what the run wrote (a
subprocess sees the notebook's file). Scratch and cache folders (``tempfile``'s ``tmp...`` files and
folders, torch.compile's ``torchinductor_*``, ``~/.cache``, Triton's) are left alone: compilers and
other processes read what is written there. Other paths under the temporary folder (a project kept
in ``/tmp``) are the notebook's like any other.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["WritesKeptApart", "kept_apart_note", "writes_kept_apart"]

#: Mode letters that write.
_WRITING = frozenset("wax+")


class WritesKeptApart:
    """The files one run wrote (by their real path, in order) and where their bytes are."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._shadows: dict[str, str] = {}
        self._count = 0
        self._lock = threading.Lock()
        self._exempt = tuple(os.path.join(os.path.abspath(f), "") for f in _exempt_folders(folder))
        self._scratch_root = os.path.join(os.path.abspath(tempfile.gettempdir()), "")

    @property
    def written(self) -> list[str]:
        """The real paths of the files the run wrote (and did not remove or rename), in order."""
        return list(self._shadows)

    def shadow_of(self, path: str) -> str | None:
        """Where the run's copy of the real file ``path`` (absolute) is, if it wrote one."""
        return self._shadows.get(path)

    def _real(self, file: Any) -> str | None:
        """The absolute path ``file`` names, or None when it is not kept apart (fd, exempt)."""
        if isinstance(file, int) or not isinstance(file, str | bytes | os.PathLike):
            return None
        path = os.path.abspath(os.fsdecode(os.fspath(file)))
        if path.startswith(self._exempt):
            return None
        if path.startswith(self._scratch_root):
            # tempfile's own names (mkstemp, mkdtemp: "tmp...") and torch.compile's cache hold
            # scratch files other processes read; a project kept under /tmp is the notebook's
            first = path[len(self._scratch_root) :].partition(os.sep)[0]
            if first.startswith(_SCRATCH_PREFIXES):
                return None
        return path

    def _new_shadow(self, real: str) -> str:
        with self._lock:
            self._count += 1
            shadow = os.path.join(self.folder, str(self._count))
            self._shadows[real] = shadow
        return shadow

    def open_path(self, file: Any, mode: str, real_open: Any) -> Any:
        """The path ``open(file, mode)`` should open instead of ``file`` (or ``file`` itself)."""
        real = self._real(file)
        if real is None:
            return file
        shadow = self._shadows.get(real)
        if shadow is not None:
            return shadow
        if not _WRITING & set(mode):
            return file  # a file the run did not write reads as it is
        exists = os.path.exists(real)
        if "x" in mode and exists:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(file))
        if "w" not in mode and "x" not in mode:  # "a", "r+": they build on the file as it is
            if not exists:
                if "r" in mode:
                    return file  # r+ of a missing file: the open fails as it would
            else:
                shadow = self._new_shadow(real)
                with real_open(real, "rb") as source, real_open(shadow, "wb") as copy:
                    shutil.copyfileobj(source, copy)
                return shadow
        return self._new_shadow(real)

    def renamed(self, src: Any, dst: Any) -> bool:
        """Follow ``os.replace(src, dst)`` of a file the run wrote; False when it wrote none."""
        real_src, real_dst = self._real(src), self._real(dst)
        if real_src is None or real_dst is None:
            return False
        with self._lock:
            shadow = self._shadows.pop(real_src, None)
            if shadow is None:
                return False
            old = self._shadows.pop(real_dst, None)
            self._shadows[real_dst] = shadow
        if old is not None:
            with contextlib.suppress(OSError):
                os.unlink(old)
        return True

    def removed(self, path: Any) -> bool:
        """Follow ``os.remove(path)`` of a file the run wrote; False when it wrote none."""
        real = self._real(path)
        with self._lock:
            shadow = self._shadows.pop(real, None) if real is not None else None
        if shadow is None:
            return False
        with contextlib.suppress(OSError):
            os.unlink(shadow)
        return True

    def stat_path(self, path: Any) -> Any:
        """The path ``os.stat(path)`` should look at: the run's copy of a file it wrote."""
        real = self._real(path)
        shadow = self._shadows.get(real) if real is not None else None
        return path if shadow is None else shadow


#: First names below the temporary folder that are scratch: tempfile's, torch.compile's cache.
_SCRATCH_PREFIXES = ("tmp", "torchinductor_")


def _exempt_folders(own: str) -> list[str]:
    home = os.path.expanduser("~")
    folders = [
        own,
        os.path.join(home, ".cache"),
        os.path.join(home, ".triton"),
        "/dev",
        "/proc",
        "/sys",
    ]
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME"):
        if os.environ.get(variable):
            folders.append(os.environ[variable])
    return folders


@contextlib.contextmanager
def writes_kept_apart() -> Iterator[WritesKeptApart]:
    """Keep the files the code run inside writes apart from the real ones, until it ends.

    Yields the :class:`WritesKeptApart` record (``written``: the real paths the run wrote). The
    private copies are deleted on exit. Patches ``builtins.open``, ``io.open`` and ``os``'s
    ``replace``, ``rename``, ``remove``, ``unlink`` and ``stat`` for the duration, in every thread.
    """
    folder = tempfile.mkdtemp(prefix="neuron-workbench-writes-")
    record = WritesKeptApart(folder)
    real_open = builtins.open
    real_replace, real_rename = os.replace, os.rename
    real_remove, real_unlink, real_stat = os.remove, os.unlink, os.stat

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("opener") is not None or (len(args) > 5 and args[5] is not None):
            # an opener decides what is opened (NamedTemporaryFile names its folder here)
            return real_open(file, mode, *args, **kwargs)
        return real_open(record.open_path(file, mode, real_open), mode, *args, **kwargs)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if not record.renamed(src, dst):
            real_replace(src, dst, **kwargs)

    def rename(src: Any, dst: Any, **kwargs: Any) -> None:
        if not record.renamed(src, dst):
            real_rename(src, dst, **kwargs)

    def remove(path: Any, **kwargs: Any) -> None:
        if not record.removed(path):
            real_remove(path, **kwargs)

    def unlink(path: Any, **kwargs: Any) -> None:
        if not record.removed(path):
            real_unlink(path, **kwargs)

    def stat(path: Any, **kwargs: Any) -> Any:
        return real_stat(record.stat_path(path), **kwargs)

    serialization = sys.modules.get("torch.serialization")
    real_zip_writer = getattr(serialization, "_open_zipfile_writer", None)

    def zip_writer(name_or_buffer: Any) -> Any:
        # torch.save hands a path to its C++ zip writer, which opens it below Python
        if isinstance(name_or_buffer, str | os.PathLike):
            name_or_buffer = record.open_path(name_or_buffer, "wb", real_open)
        return real_zip_writer(name_or_buffer)

    torch = sys.modules.get("torch")
    real_load = getattr(serialization, "load", None)

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        # torch.load(path, mmap=True) maps the path itself, below Python
        if isinstance(f, str | os.PathLike):
            f = record.open_path(f, "rb", real_open)
        return real_load(f, *args, **kwargs)

    saved = [
        (builtins, "open", real_open),
        (io, "open", io.open),
        (os, "replace", real_replace),
        (os, "rename", real_rename),
        (os, "remove", real_remove),
        (os, "unlink", real_unlink),
        (os, "stat", real_stat),
    ]
    if real_zip_writer is not None:
        saved.append((serialization, "_open_zipfile_writer", real_zip_writer))
        serialization._open_zipfile_writer = zip_writer  # type: ignore[union-attr]
    if real_load is not None and torch is not None and torch.load is real_load:
        saved += [(serialization, "load", real_load), (torch, "load", real_load)]
        serialization.load = torch.load = load  # type: ignore[union-attr]
    builtins.open = open_
    io.open = open_
    os.replace, os.rename, os.remove, os.unlink, os.stat = replace, rename, remove, unlink, stat
    try:
        yield record
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        shutil.rmtree(folder, ignore_errors=True)


def kept_apart_note(paths: list[str], kept_run: str | None) -> str:
    """The report's note on a run whose writes to ``paths`` were kept apart."""
    here = os.path.join(os.getcwd(), "")
    names = [p[len(here) :] if p.startswith(here) else p for p in paths]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    kept = "target" if kept_run == "target" else "reference"
    files = "file" if len(paths) == 1 else "files"
    return (
        f"its writes to {len(paths)} {files} were kept apart (the notebook's files hold the "
        f"{kept} run's): {shown}"
    )
