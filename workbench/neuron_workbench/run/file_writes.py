"""Files a run writes that must not reach the notebook's: every run but the kept one.

A ``%%neuron`` cell runs twice, and on the default path both runs go at the same time. A cell that
saves a checkpoint (``torch.save(model.state_dict(), "ckpt.pt")``) had both runs write the same
file: whichever finished last won, so after the cell the file could hold the target's storages,
tagged ``neuron:0``, which the kernel (no device) cannot load. The namespace holds the kept run's
results (the reference's unless ``--keep target``), and so must the files.

While :func:`writes_kept_apart` is active, Python-level opens for writing (``open``/``io.open``,
which NumPy, pandas, ``pickle`` to a file, ``json``, matplotlib and ``pathlib`` use, and
``torch.save``'s zip writer, TorchScript's archive writer (``torch.jit.save``, ``model.save``),
the profiler's trace writer (``tensorboard_trace_handler``'s); ``torch.load(path, mmap=True)`` and
``torch.jit.load(path)`` too) go to a private folder instead of the named file, and the run
reads back what it wrote from there (the ``open`` a notebook's namespace holds, IPython's wrapper,
included). ``os.replace``/``rename``/``remove``/``unlink``,
``shutil.rmtree`` and ``os.rmdir`` act in the run's view only: a real file or folder the run removes
or renames away is hidden from it, never touched (``os.mkdir``/``makedirs`` give it a removed folder
back, empty); ``os.stat`` (so ``os.path.exists``), ``os.chmod`` and ``os.utime`` follow the same
view, and so does ``os.open`` (``Path.touch``; a file it makes new, ``tempfile.mkstemp(dir=...)``'s,
is made for real and is the run's own: renamed into place, it leaves the folder). Folder listings
(``os.listdir``, ``os.scandir``, so ``glob``, ``os.walk`` and ``pathlib``'s ``iterdir`` and ``glob``)
show the run's view too: the files it wrote, not those it removed; an entry for a file it wrote is
not an ``os.DirEntry`` but has its attributes and methods. Files it did not write read as the cell
found them: the kept run writes the real files meanwhile (or first, with ``--profile``), so before
it first changes one during the cell it keeps the original in the cell's folder of originals, and
notes there the files it makes (:func:`originals_kept`); the other runs read the originals instead
and do not see those files, in lookups, opens and listings (:class:`CellStartFiles`). A cell that
resumes from its own checkpoint (``if os.path.exists("state.pt"): w = torch.load("state.pt")``,
then ``torch.save(w, "state.pt")``) resumes from the same one in every run.
safetensors' files (``save_file``, ``save_model``, so ``save_pretrained``; read back through
``safe_open`` and ``load_file``, so ``from_pretrained``) are kept apart too, though its Rust code
opens them. Not covered: other writes made below Python (HDF5), listings of bytes paths
and fds, folder renames, ``os.lstat`` (``os.path.lexists``), the kept run's changes to folders (one
it makes or removes is there, or gone, for the other runs; the files in it are kept), and other
processes reading or writing what the run wrote (a subprocess sees the notebook's file; a forked
child's writes are its own). The patches hold for the process while the run lasts, so another
thread's writes meanwhile are kept apart too. Scratch and cache folders (``tempfile``'s ``tmp...``
files and folders made during the run, torch.compile's ``torchinductor_*``, ``~/.cache``, Triton's)
are left alone: compilers and other processes read what is written there. A ``tmp...`` file or
folder that was there when the run started (a plain cell's ``tempfile.mkdtemp()`` for checkpoints)
is the notebook's, like any other path under the temporary folder (a project kept in ``/tmp``).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import hashlib
import io
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, MutableMapping
from typing import Any

from neuron_workbench.run.patching import patched_attributes

__all__ = [
    "CellStartFiles",
    "OriginalsKept",
    "WritesKeptApart",
    "kept_apart_note",
    "originals_folder",
    "originals_kept",
    "tempfile_names",
    "tempfile_names_drawn",
    "writes_kept_apart",
]

#: Mode letters that write.
_WRITING = frozenset("wax+")


class _NotebookPaths:
    """Which paths are the notebook's files, which a run keeps apart (the rest are scratch)."""

    def __init__(self, own: list[str], notebook_temp: frozenset[str] | None) -> None:
        # the workbench's own folders (a run's private copies, the cell's originals) among them
        self.exempt = tuple(os.path.join(os.path.abspath(f), "") for f in _exempt_folders(own))
        self.scratch_root = os.path.join(os.path.abspath(tempfile.gettempdir()), "")
        # tempfile's names made before the run (a plain cell's mkdtemp() for checkpoints) are the
        # notebook's: both runs would otherwise write, and read back, the same file at once
        self.notebook_temp = tempfile_names() if notebook_temp is None else notebook_temp

    def real(self, file: Any) -> str | None:
        """The absolute path ``file`` names, or None when it is not kept apart (fd, exempt)."""
        if isinstance(file, int) or not isinstance(file, str | bytes | os.PathLike):
            return None
        path = os.path.abspath(os.fsdecode(os.fspath(file)))
        if path.startswith(self.exempt) or os.path.join(path, "") == self.scratch_root:
            return None  # the temporary folder itself: tempfile's TemporaryFile opens it
        if path.startswith(self.scratch_root) and not path.startswith(
            os.path.join(os.getcwd(), "")
        ):
            # tempfile's own names (mkstemp, mkdtemp: "tmp...") and torch.compile's cache hold
            # scratch files other processes read; a project kept under /tmp is the notebook's,
            # and so is everything below the working folder (a clone made by `mktemp -d`)
            first = path[len(self.scratch_root) :].partition(os.sep)[0]
            if first.startswith(_SCRATCH_PREFIXES) and first not in self.notebook_temp:
                return None
        return path


class WritesKeptApart:
    """The files one run wrote (by their real path, in order) and where their bytes are.

    The run's view of the disk is the real one, plus the files it wrote (private copies), minus
    the real files it removed or renamed away (only hidden from it: the disk keeps them).
    """

    def __init__(
        self,
        folder: str,
        notebook_temp: frozenset[str] | None = None,
        at_start: CellStartFiles | None = None,
    ) -> None:
        self.folder = folder
        #: The originals of the files the kept run changed during the cell: what this run reads
        #: in their place. None: the disk as it is (no other run writes meanwhile).
        self.at_start = at_start
        self.folder_made = os.path.isdir(folder)  # made by the first copy (see _next_shadow)
        self._shadows: dict[str, str] = {}
        self._deleted: set[str] = set()
        self._made: set[str] = set()  # real files the run made new: its own (mkstemp's)
        self._made_folders: set[str] = set()  # real folders the run made
        self._count = 0
        self._made_since: frozenset[str] = frozenset()  # by the kept run, at the last listing
        self._lock = threading.RLock()
        own = [folder] if at_start is None else [folder, at_start.folder]
        self._paths = _NotebookPaths(own, notebook_temp)

    @property
    def written(self) -> list[str]:
        """The real paths of the files the run wrote (and did not remove or rename), in order."""
        return list(self._shadows)

    def shadow_of(self, path: str) -> str | None:
        """Where the run's copy of the real file ``path`` (absolute) is, if it wrote one."""
        return self._shadows.get(path)

    def _real(self, file: Any) -> str | None:
        return self._paths.real(file)

    def _next_shadow(self) -> str:
        """Where the run's next private copy goes (the private folder is made for the first)."""
        if not self.folder_made:
            # Most runs write no file: their folder is never made, for removing an empty folder
            # costs milliseconds on some disks (4 ms a run on an ext4 mounted with discard).
            os.mkdir(self.folder, 0o700)
            self.folder_made = True
        return os.path.join(self.folder, str(self._count + 1))

    def _new_shadow(self, real: str) -> str:
        shadow = self._next_shadow()
        self._count += 1
        self._shadows[real] = shadow
        self._deleted.discard(real)
        return shadow

    def _exists(self, real: str) -> bool:
        """Whether the run sees ``real``: a copy of its own, or a real file it did not remove."""
        return real in self._shadows or (real not in self._deleted and self._was_there(real))

    def _at_start(self, real: str) -> str | None:
        """Where ``real``'s bytes at the cell's start are (see :meth:`CellStartFiles.where`)."""
        return real if self.at_start is None else self.at_start.where(real)

    def _was_there(self, real: str) -> bool:
        """Whether ``real`` was there when the cell started (as a link: it need not lead on)."""
        start = self._at_start(real)
        return start is not None and os.path.lexists(start)

    def changed_by_kept_run(self, file: Any) -> bool:
        """Whether the kept run has changed (or made) ``file`` since the cell started.

        Asked again after a real file was opened or looked at: the kept run may have changed it
        between the run's look at the record and its own open (what it opened is then dropped).
        """
        if self.at_start is None:
            return False
        real = self._real(file)
        return real is not None and real not in self._shadows and self._at_start(real) != real

    def open_path(self, file: Any, mode: str, real_open: Any) -> Any:
        """The path ``open(file, mode)`` should open instead of ``file`` (or ``file`` itself)."""
        real = self._real(file)
        if real is None:
            return file
        with self._lock:
            shadow = self._shadows.get(real)
            if shadow is not None:
                return shadow
            if real in self._made:
                return file  # the run's own file (mkstemp's): written where it is
            gone = real in self._deleted
            start = None if gone else self._at_start(real)
            if not _WRITING & set(mode):
                if start is None:
                    raise _not_found(file)
                # a file the run did not write reads as it was when the cell started
                return file if start == real else start
            exists = start is not None and os.path.exists(start)
            if "x" in mode and exists:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(file))
            if "w" not in mode and "x" not in mode and exists:
                # "a", "r+": they build on the file as it is (a folder raises, no copy is kept)
                shadow = self._next_shadow()
                with real_open(start, "rb") as source, real_open(shadow, "wb") as copy:
                    shutil.copyfileobj(source, copy)
                return self._new_shadow(real)
            if "r" in mode and "w" not in mode and not exists:
                raise _not_found(file)  # r+ of a file that is not there
            return self._new_shadow(real)

    def renamed(self, src: Any, dst: Any, real_replace: Any) -> bool:
        """Carry out ``os.replace(src, dst)`` in the run's view; False: do it for real."""
        real_src, real_dst = self._real(src), self._real(dst)
        if real_src is None and real_dst is None:
            return False  # scratch to scratch
        with self._lock:
            if real_src is not None and not self._exists(real_src):
                raise _not_found(src)
            shadow = self._shadows.pop(real_src, None) if real_src is not None else None
            if real_dst is None:
                # into scratch (a compiler's input, say): the bytes go there for real
                if shadow is not None:
                    real_replace(shadow, dst)
                elif real_src in self._made:  # the run's own file
                    real_replace(src, dst)
                    self._made.discard(real_src)  # type: ignore[arg-type]
                else:
                    shutil.copyfile(self._at_start(real_src) or real_src, dst)  # type: ignore[arg-type]
                    self._deleted.add(real_src)  # type: ignore[arg-type]
                return True
            old = self._shadows.pop(real_dst, None)
            target = self._new_shadow(real_dst)
            if shadow is not None:
                real_replace(shadow, target)
            elif real_src is None or real_src in self._made:
                # a scratch file, or one the run made (mkstemp's, written then renamed into
                # place): moved in whole
                try:
                    real_replace(src, target)
                except OSError:  # another file system
                    shutil.copyfile(src, target)
                    os.unlink(src)
                self._made.discard(real_src)  # type: ignore[arg-type]
            else:
                # a real file the run did not write: copied, and hidden from the run at its name
                shutil.copyfile(self._at_start(real_src) or real_src, target)
                self._deleted.add(real_src)
        if old is not None:
            with contextlib.suppress(OSError):
                os.unlink(old)
        return True

    def made_new(self, path: Any, folder: bool = False) -> None:
        """Remember a file (``os.open`` with ``O_EXCL``) or folder the run made for real: its own."""
        real = self._real(path)
        if real is not None:
            with self._lock:
                (self._made_folders if folder else self._made).add(real)

    def _remove_made(self, real: str) -> bool:
        """Remove for real what the run made at ``real`` (a folder: if nothing else is in it)."""
        if real in self._made:
            self._made.discard(real)
            with contextlib.suppress(OSError):
                _UNLINK(real)
            return True
        if real in self._made_folders:
            self._made_folders.discard(real)
            try:
                _RMDIR(real)  # the other run's files in it (a folder of a fixed name) stay
            except OSError:
                return False
            return True
        return False

    def remove_what_it_made(self) -> None:
        """At the run's end, remove what it made and left, which no other run sees.

        Files (``NamedTemporaryFile(delete=False)`` in the notebook's folder: the kept run's
        stays), and the folders it made and removed in its view.
        """
        with self._lock:
            for real in list(self._made):
                self._remove_made(real)
            for real in sorted(self._made_folders, reverse=True):  # inner ones first
                if real in self._deleted:
                    self._remove_made(real)

    def removed(self, path: Any) -> bool:
        """Carry out ``os.remove(path)`` in the run's view; False: do it for real."""
        real = self._real(path)
        if real is None:
            return False
        with self._lock:
            if real in self._made and real not in self._shadows:
                self._made.discard(real)
                return False  # the run's own file: removed for real
            if not self._exists(real):
                raise _not_found(path)
            shadow = self._shadows.pop(real, None)
            # the real file stays: the kept run decides about it; the run no longer sees it
            if shadow is None or self._was_there(real):
                self._deleted.add(real)
            if shadow is None:
                return True
        with contextlib.suppress(OSError):
            os.unlink(shadow)
        return True

    def removed_tree(self, path: Any) -> bool:
        """Carry out ``shutil.rmtree(path)`` in the run's view; False: do it for real.

        The run's copies below ``path`` are deleted; the real files and folders there are only
        hidden from it (the kept run's checkpoint, saved there a moment ago, stays on disk).
        """
        real = self._real(path)
        if real is None or os.path.islink(real):
            return False  # scratch; a link, which rmtree refuses
        with self._lock:
            if real in self._deleted or not os.path.isdir(real):
                raise _not_found(path)
            below = os.path.join(real, "")
            for written in [p for p in self._shadows if p.startswith(below)]:
                with contextlib.suppress(OSError):
                    _UNLINK(self._shadows.pop(written))
            for below_real in _below(real):
                self._hide(below_real)
            self._hide(real)
        return True

    def _hide(self, real: str) -> None:
        """Take ``real`` out of the run's view: removed for real if the run made it, else hidden."""
        if not self._remove_made(real):
            self._deleted.add(real)

    def removed_folder(self, path: Any) -> bool:
        """Carry out ``os.rmdir(path)`` in the run's view (hidden, not removed); False: for real."""
        real = self._real(path)
        if real is None:
            return False
        with self._lock:
            if real in self._deleted or not os.path.isdir(real):
                raise _not_found(path)
            below = os.path.join(real, "")
            seen = [e for e in _LISTDIR(real) if self._exists(os.path.join(real, e))]
            if seen or any(p.startswith(below) for p in self._shadows):
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), os.fsdecode(path))
            self._hide(real)
        return True

    def made_folder(self, path: Any) -> bool:
        """Carry out ``os.mkdir(path)`` in the run's view; False: do it for real.

        A folder the run removed in its view (it is still on disk) is there again for it; what it
        held stays hidden.
        """
        real = self._real(path)
        if real is None:
            return False
        with self._lock:
            if real not in self._deleted or not _real_folder(real):
                return False
            self._deleted.discard(real)
        return True

    def _in_view(self, path: Any) -> tuple[str | None, Any]:
        """``path``'s real path (None: not kept apart) and what the run sees there.

        The run's copy of a file it wrote, else the original of a file the kept run changed during
        the cell, else ``path`` itself; ``FileNotFoundError`` for a file it removed or renamed
        away, or one the kept run made.
        """
        real = self._real(path)
        if real is None:
            return None, path
        shadow = self._shadows.get(real)
        if shadow is not None:
            return real, shadow
        start = None if real in self._deleted else self._at_start(real)
        if start is None:
            raise _not_found(path)
        return real, path if start == real else start

    def folder_view(self, path: Any) -> tuple[str, dict[str, str]] | None:
        """What a listing of the folder ``path`` shows besides the real entries.

        Parameters
        ----------
        path
            What ``os.listdir``/``os.scandir`` was given (None: the working folder).

        Returns
        -------
        tuple[str, dict[str, str]] | None
            The folder's absolute path and the files directly in it whose bytes are elsewhere
            (name: where): the run's own copies, and the originals of those the kept run changed
            or removed during the cell; the real entries the run removed or renamed away, and
            those the kept run made, are left out by :meth:`hides`. None where
            the real listing is the run's: an fd, a bytes path, or nothing kept apart yet.

        Raises
        ------
        FileNotFoundError
            The run removed the folder in its view.
        """
        if path is None:
            path = "."
        if isinstance(path, int) or not isinstance(path, str | os.PathLike):
            return None  # an fd (glob's dir_fd), bytes: as they are
        path = os.fspath(path)
        if not isinstance(path, str):
            return None
        with self._lock:
            started = self.at_start.listed() if self.at_start is not None else {}
            if not self._shadows and not self._deleted and not started:
                return None
            # the folder itself may be exempt or scratch (the temporary folder): files in it that
            # are kept apart (a project kept in /tmp) are still named by their absolute path
            folder = os.path.abspath(path)
            if folder in self._deleted:
                raise _not_found(path)
            # the originals of the files the kept run changed or removed there, then the run's own
            own = {
                os.path.basename(real): original
                for real, original in started.items()
                if original is not None
                and real not in self._deleted
                and os.path.dirname(real) == folder
            }
            own.update(
                (os.path.basename(real), shadow)
                for real, shadow in self._shadows.items()
                if os.path.dirname(real) == folder
            )
            self._made_since = frozenset(
                real for real, original in started.items() if original is None
            )
        return folder, own

    def hides(self, real: str) -> bool:
        """Whether the real file or folder ``real`` is out of the run's view.

        Parameters
        ----------
        real
            An absolute path, as :meth:`folder_view`'s folder joined with an entry's name.

        Returns
        -------
        bool
            True where the run removed or renamed it away (it is still on disk), or the kept run
            made it during the cell.
        """
        return real in self._deleted or (real in self._made_since and real not in self._shadows)

    def stat_path(self, path: Any) -> Any:
        """The path ``os.stat(path)`` should look at: the run's copy of a file it wrote."""
        return self._in_view(path)[1]

    def changed_path(self, path: Any) -> Any:
        """The path ``os.chmod``/``os.utime`` should change, or None: a real file left alone."""
        real, seen = self._in_view(path)
        if real is None or real in self._shadows:
            return seen
        if not self._was_there(real):
            raise _not_found(path)
        return None  # a real file the run did not write: the kept run sets its own metadata


def originals_folder() -> str:
    """A name for a cell's folder of originals (:class:`OriginalsKept`), unique to the cell.

    The kernel names it before the cell's runs start and gives it to each; the kept run makes it
    at its first change to a file, and the kernel removes it once every run of the cell ended.
    """
    return os.path.join(
        tempfile.gettempdir(), f"neuron-workbench-originals-{os.getpid()}-{uuid.uuid4().hex}"
    )


def _original_of(folder: str, real: str) -> str:
    """Where in the cell's folder of originals the one of the real file ``real`` goes."""
    return os.path.join(folder, hashlib.sha1(os.fsencode(real)).hexdigest())


#: The list of the real paths with an entry in a folder of originals (for folder listings).
_ORIGINALS_LISTED = "paths"


class CellStartFiles:
    """The notebook's files as the cell found them, where its kept run changed them since.

    What a run not kept reads in place of a real file: the kept run goes at the same time (or ran
    first, with ``--profile``) and writes the real files, so a cell resuming from its own
    checkpoint (``if os.path.exists("state.pt"): w = torch.load("state.pt")``, then
    ``torch.save(w, "state.pt")``) found the kept run's checkpoint and resumed from it.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def where(self, real: str) -> str | None:
        """Where ``real``'s bytes at the cell's start are.

        ``real`` itself, the kept run's copy of the original where it changed the file since, or
        None where the kept run made the file.
        """
        entry = _original_of(self.folder, real)
        try:
            mode = _LSTAT(entry).st_mode
        except OSError:  # no entry: the kept run has not changed it (nor made the folder)
            return real
        return None if stat.S_ISLNK(mode) else entry

    def listed(self) -> dict[str, str | None]:
        """The real paths the kept run changed so far, each with :meth:`where`'s answer."""
        try:
            fd = _OS_OPEN(os.path.join(self.folder, _ORIGINALS_LISTED), os.O_RDONLY)
        except OSError:
            return {}
        with io.FileIO(fd, closefd=True) as listing:
            names = listing.readall().split(b"\0")
        paths = {os.fsdecode(name) for name in names if name}
        return {path: self.where(path) for path in paths}


class OriginalsKept:
    """The kept run's changes to the notebook's files, each preceded by keeping the original.

    The kept run writes, removes and renames the real files as any code does. Before it first
    changes one during the cell, the file as it was goes into the cell's folder of originals: a
    hard link where the change only takes the name away (``os.remove``, ``os.replace`` over it),
    a copy where the file changes in place (``open(path, "w")``, ``"a"``, ``"r+"``, and a file on
    another file system than the folder): the kept run then writes the file itself, as plain code
    does, so every holder of it (the notebook's ``log``, a subprocess, ``tail -f``) goes on with
    the same file, owner and attributes, and an open that fails leaves it whole. A reader that
    opened it before the overwrite can see the new bytes. A file it makes new is
    noted there as not there before (a dangling link). The other runs of the cell read the
    originals through :class:`CellStartFiles`. Each entry is complete before it is there (a link,
    a copy renamed into place), and there before the real file changes.
    """

    def __init__(self, folder: str, notebook_temp: frozenset[str] | None = None) -> None:
        self.folder = folder
        self.folder_made = False
        self._notebook_temp = notebook_temp
        # found now, before the patches: found at the first write instead, tempfile's first
        # gettempdir() in the process opened a probe file through the patched os.open, which
        # asked for them again under tempfile's lock (the worker hung, its parent-watch too)
        self._paths = _NotebookPaths([self.folder], notebook_temp)
        self._touched: set[str] = set()  # real paths changed during the cell: entries made
        # real paths naming the file an entry links to (renamed there by the run): changing them
        # in place would change the original
        self._shared: dict[str, str] = {}  # ... and the entry that links to it
        self._lock = threading.RLock()
        # a child the run forks (a DataLoader's persistent worker) holds the patches after the
        # cell: its writes are its own, and it would make the folder again once removed
        self._pid = os.getpid()

    def before_open(self, file: Any, mode: str) -> None:
        """Keep the original of ``file`` before ``open(file, mode)`` (a writing mode) changes it."""
        real = self._paths.real(file) if os.getpid() == self._pid else None
        if real is None:
            return
        with self._lock:
            if real in self._touched:
                if real in self._shared:
                    self._unshare(real)
                return
            if "x" in mode and os.path.lexists(real):
                return  # the open fails: nothing changes
            self._keep(real, "truncate" if "w" in mode else "in place")

    def before_removal(self, path: Any) -> None:
        """Keep the original of ``path`` before ``os.remove(path)`` takes it away."""
        real = self._paths.real(path) if os.getpid() == self._pid else None
        if real is None:
            return
        with self._lock:
            self._shared.pop(real, None)
            if real not in self._touched:
                self._keep(real, "unname")

    def before_tree_removal(self, path: Any) -> None:
        """Keep the originals of the files below ``path`` before ``shutil.rmtree(path)``."""
        real = self._paths.real(path) if os.getpid() == self._pid else None
        if real is None or os.path.islink(real):
            return  # scratch; a link, which rmtree refuses
        for below in _below(real):
            if not _real_folder(below):
                self.before_removal(below)

    def before_rename(self, src: Any, dst: Any) -> None:
        """Keep the originals of ``src`` and ``dst`` before ``os.replace(src, dst)``."""
        if os.getpid() != self._pid:
            return
        real_src, real_dst = self._paths.real(src), self._paths.real(dst)
        with self._lock:
            if real_dst is not None:
                self.before_removal(real_dst)
            if real_src is None:
                return
            shared = self._shared.pop(real_src, None)
            if real_src not in self._touched and self._keep(real_src, "unname"):
                shared = _original_of(self.folder, real_src)
            if shared is not None and real_dst is not None:
                self._shared[real_dst] = shared  # the original goes on under the new name

    def _keep(self, real: str, change: str) -> bool:
        """Put ``real``'s original (or its absence) in the folder; True: as a link to the file.

        A failure (a full disk) is not the cell's: its change goes ahead, as in a plain run, and
        the other runs see it, as they did before originals were kept.
        """
        self._touched.add(real)
        try:
            return self._kept(real, change)
        except OSError:
            return False

    def _kept(self, real: str, change: str) -> bool:
        entry = self._entry(real)
        try:
            st = _LSTAT(real)
        except FileNotFoundError:
            self._note(real, lambda: _SYMLINK(_NOT_THERE, entry))
            return False
        except OSError:
            return False
        if stat.S_ISDIR(st.st_mode):
            return False  # folders are not kept
        if stat.S_ISREG(st.st_mode) and change == "unname":
            try:
                self._note(real, lambda: _LINK(real, entry))
            except OSError:
                pass  # another file system: copied
            else:
                return True
        # written where it is (the file stays the one every holder has open, with its owner and
        # attributes, and an open that then fails leaves it whole): its bytes are copied first
        part = f"{entry}.part"
        try:
            shutil.copyfile(real, part)
        except FileNotFoundError:  # a link to nothing
            self._note(real, lambda: _SYMLINK(_NOT_THERE, entry))
            return False
        self._note(real, lambda: _REPLACE(part, entry))
        return False

    def _unshare(self, real: str) -> None:
        """Give the entry linked to the file ``real`` names bytes of its own, before a write there.

        (The run renamed a file it had not changed to ``real``: its entry is a link to that file.)
        """
        entry = self._shared.pop(real)
        part = f"{entry}.part"
        with contextlib.suppress(OSError):
            shutil.copyfile(entry, part)
            _REPLACE(part, entry)

    def _entry(self, real: str) -> str:
        if not self.folder_made:
            # most cells change no file: the folder is made for the first one only
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.folder, 0o700)
            self.folder_made = True
        return _original_of(self.folder, real)

    def _note(self, real: str, make_entry: Any) -> None:
        """Make ``real``'s entry, then list it (listings read the list, lookups the entry)."""
        make_entry()
        fd = _OS_OPEN(
            os.path.join(self.folder, _ORIGINALS_LISTED),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
        try:
            os.write(fd, os.fsencode(real) + b"\0")  # one write: whole in a concurrent read
        finally:
            _OS_CLOSE(fd)


#: What the entry of a file the kept run made new links to.
_NOT_THERE = "not-there-when-the-cell-started"


@contextlib.contextmanager
def originals_kept(
    folder: str,
    namespace: MutableMapping[str, Any] | None = None,
    notebook_temp: frozenset[str] | None = None,
) -> Iterator[OriginalsKept]:
    """Keep the original of each notebook file the code run inside changes, until it ends.

    For the kept run of a cell whose other runs read the files as the cell found them
    (:func:`writes_kept_apart` given ``folder``). Patches ``builtins.open``, ``io.open`` and
    ``namespace``'s ``open``, ``os``'s ``open``, ``replace``, ``rename``, ``remove`` and
    ``unlink``, ``shutil.rmtree``, torch's zip writer, TorchScript's archive writer, the
    profiler's trace writer and safetensors' writer (when loaded); an open for reading costs one
    more call. The folder stays:
    the cell's other runs may still read it.
    """
    record = OriginalsKept(folder, notebook_temp)

    def writing(open_fn: Any) -> Any:
        @functools.wraps(open_fn)
        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if not _WRITING.isdisjoint(mode):
                record.before_open(file, mode)
            return open_fn(file, mode, *args, **kwargs)

        return open_

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_ACCMODE | os.O_CREAT | os.O_TRUNC) and kwargs.get("dir_fd") is None:
            if not flags & _O_DIRECTORY:
                record.before_open(path, _mode_of(flags))
        return real_os_open(path, flags, *args, **kwargs)

    def before(real: Any, keep: Any) -> Any:
        def call(*paths: Any, **kwargs: Any) -> None:
            if not kwargs:  # src_dir_fd, dir_fd: relative to a folder's fd, left as they are
                keep(*paths)
            real(*paths, **kwargs)

        return call

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("dir_fd") is None:
            record.before_tree_removal(path)
        real_rmtree(path, *args, **kwargs)

    real_os_open, real_rmtree = os.open, shutil.rmtree
    open_ = writing(builtins.open)
    patches: list[tuple[Any, Any]] = [
        (builtins, {"open": open_}),
        (io, {"open": open_}),
        (
            os,
            {
                "open": os_open,
                "replace": before(os.replace, record.before_rename),
                "rename": before(os.rename, record.before_rename),
                "remove": before(os.remove, record.before_removal),
                "unlink": before(os.unlink, record.before_removal),
            },
        ),
        (shutil, {"rmtree": rmtree}),
    ]

    def kept_before_writing(path: Any) -> Any:
        record.before_open(path, "wb")
        return path

    patches += _zip_writer_patches(kept_before_writing)
    patches += _torchscript_writer_patches(kept_before_writing)
    patches += _profiler_trace_patches(kept_before_writing)
    safetensors_api = sys.modules.get("safetensors.torch")
    real_writer = getattr(safetensors_api, "serialize_file", None)
    if real_writer is not None:

        def serialize_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
            record.before_open(filename, "wb")
            return real_writer(tensors, filename, *args, **kwargs)

        patches.append((safetensors_api, {"serialize_file": serialize_file}))
    with _patched(patches, namespace, writing):
        yield record


#: ``os.open`` of a folder (``O_TMPFILE`` includes it): never a file of the run's.
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _mode_of(flags: int) -> str:
    """The ``open()`` mode whose effect on a file ``os.open`` with ``flags`` has.

    Without ``O_TRUNC`` a file opened for writing keeps its bytes (``"a"`` builds on them, making
    the file where ``O_CREAT`` allows; ``"r+"`` where it does not).
    """
    if flags & os.O_ACCMODE == os.O_RDONLY and not flags & (os.O_CREAT | os.O_TRUNC):
        return "r"
    if flags & os.O_CREAT and flags & os.O_EXCL:
        return "x"
    if flags & os.O_TRUNC:
        return "w"
    return "a" if flags & os.O_CREAT else "r+"


def _real_folder(path: str) -> bool:
    """Whether ``path`` is a folder on disk, whatever a run's view of it (``os.stat`` unpatched)."""
    try:
        return stat.S_ISDIR(_STAT(path).st_mode)
    except OSError:
        return False


#: ``os`` functions as this module found them: a run's patches answer for the run's view.
_STAT, _UNLINK, _RMDIR, _LISTDIR = os.stat, os.unlink, os.rmdir, os.listdir
_LSTAT, _LINK, _SYMLINK, _REPLACE = os.lstat, os.link, os.symlink, os.replace
_OS_OPEN, _OS_CLOSE = os.open, os.close


class _OwnEntry:
    """A run's own file in a folder listing, as ``os.scandir`` gives an entry.

    ``os.DirEntry`` cannot be made from Python; this has what ``glob``, ``os.walk`` and
    ``pathlib`` use of one (and the rest of its methods), and answers from the run's copy.
    """

    __slots__ = ("_copy", "name", "path")

    def __init__(self, name: str, path: str, copy: str) -> None:
        self.name, self.path, self._copy = name, path, copy

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return True

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return False

    def is_symlink(self) -> bool:
        return False

    def is_junction(self) -> bool:
        return False

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return _STAT(self._copy)

    def inode(self) -> int:
        return self.stat().st_ino

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<DirEntry {self.name!r}>"


class _ViewedScandir:
    """``os.scandir``'s iterator over a folder as a run sees it (a context manager, as that one).

    The real entries, less those the run removed or renamed away and with its own copy in place
    of a file it wrote over, then the files it wrote that are not on disk.
    """

    def __init__(self, real: Any, path: Any, folder: str, own: dict[str, str], hides: Any) -> None:
        self._real = real
        self._entries = self._walk(os.fspath(path) if path is not None else ".", folder, own, hides)

    def _walk(self, path: str, folder: str, own: dict[str, str], hides: Any) -> Iterator[Any]:
        own = dict(own)
        for entry in self._real:
            copy = own.pop(entry.name, None)
            if copy is not None:
                yield _OwnEntry(entry.name, entry.path, copy)
            elif not hides(os.path.join(folder, entry.name)):
                yield entry
        for name, copy in own.items():
            yield _OwnEntry(name, os.path.join(path, name), copy)

    def __iter__(self) -> _ViewedScandir:
        return self

    def __next__(self) -> Any:
        return next(self._entries)

    def close(self) -> None:
        self._real.close()
        self._entries.close()

    def __enter__(self) -> _ViewedScandir:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _below(folder: str) -> Iterator[str]:
    """The paths below the real ``folder``, inner ones first, as on disk (links not followed)."""
    try:
        names = _LISTDIR(folder)  # not the run's view: what it hides is hidden again, harmlessly
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.islink(path) and _real_folder(path):
            yield from _below(path)
        yield path


def _not_found(path: Any) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(os.fspath(path)))


#: First names below the temporary folder that are scratch: tempfile's, torch.compile's cache.
_SCRATCH_PREFIXES = ("tmp", "torchinductor_")
#: tempfile's own first names (mkstemp, mkdtemp and the classes over them without a prefix).
_TEMPFILE_PREFIX = "tmp"


def tempfile_names() -> frozenset[str]:
    """The names tempfile gave in the temporary folder so far (its ``tmp...`` entries).

    Taken once before a cell's runs start and given to each, so a ``tmp...`` folder the cell itself
    makes is scratch in every run, whichever made it first.
    """
    folder = tempfile.gettempdir()
    try:
        changed = os.stat(folder).st_mtime_ns
        kept = _TEMPFILE_LISTING.get(folder)
        if kept is not None and kept[0] == changed:
            return kept[1]
        listed_at = time.time_ns()
        with os.scandir(folder) as entries:
            names = frozenset(e.name for e in entries if e.name.startswith(_TEMPFILE_PREFIX))
    except OSError:
        return frozenset()
    # A busy temporary folder holds hundreds of entries (0.5 ms a cell to list). Its listing is
    # kept while its modification time stays the same, once that time is a second older than the
    # listing: a change within the file system's clock tick of the last one can leave the time as
    # it was, one made later cannot.
    if changed < listed_at - _SETTLED_NS:
        _TEMPFILE_LISTING[folder] = (changed, names)
    return names


@contextlib.contextmanager
def tempfile_names_drawn(limit: int = 256) -> Iterator[list[str]]:
    """Note the random names ``tempfile`` draws while the body runs, in order (the first ``limit``).

    Yields the list they are appended to: the eight characters ``mkdtemp``, ``mkstemp``,
    ``TemporaryDirectory`` and ``NamedTemporaryFile`` put between their prefix and suffix. Each
    run of a cell draws its own, so a path the cell builds on one (``ckpt =
    os.path.join(tmp.name, "model.pt")``) differs between the runs though the code is the same;
    the comparison pairs the names each run drew (a name drawn and found taken is noted too).
    """
    drawn: list[str] = []
    real = tempfile._get_candidate_names  # type: ignore[attr-defined]

    def candidate_names() -> Iterator[str]:
        # tempfile asks for its shared sequence at each call and takes names from it until one is
        # free; the shared sequence goes on as it would have
        names = real()
        while True:
            name = next(names)
            if len(drawn) < limit:
                drawn.append(name)
            yield name

    with patched_attributes(tempfile, {"_get_candidate_names": candidate_names}):
        yield drawn


#: The temporary folder's last listing of tempfile's names, with its modification time then.
_TEMPFILE_LISTING: dict[str, tuple[int, frozenset[str]]] = {}
_SETTLED_NS = 1_000_000_000


def _exempt_folders(own: list[str]) -> list[str]:
    home = os.path.expanduser("~")
    folders = [
        *own,
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
def writes_kept_apart(
    namespace: MutableMapping[str, Any] | None = None,
    notebook_temp: frozenset[str] | None = None,
    originals: str | None = None,
) -> Iterator[WritesKeptApart]:
    """Keep the files the code run inside writes apart from the real ones, until it ends.

    Yields the :class:`WritesKeptApart` record (``written``: the real paths the run wrote). The
    private copies are deleted on exit. With ``originals`` (the cell's folder the kept run keeps
    them in, :func:`originals_kept`), the real files read as they were when the cell started.
    Patches ``builtins.open``, ``io.open``, ``os``'s ``replace``, ``rename``, ``remove``,
    ``unlink``, ``rmdir``, ``open``, ``mkdir``, ``stat``, ``chmod``, ``utime``, ``listdir`` and
    ``scandir``, ``shutil.rmtree``, torch's zip writer and ``load``, TorchScript's archive writer
    and ``torch.jit.load``, the profiler's trace writer, and safetensors' writer and reader (when
    loaded), for the duration, in every thread;
    ``namespace``'s own ``open`` (a notebook's) goes through the private copies too.
    """
    # the name mkdtemp would give (never taken: made only when the run writes its first file)
    folder = os.path.join(
        tempfile.gettempdir(), f"neuron-workbench-writes-{os.getpid()}-{uuid.uuid4().hex}"
    )
    at_start = CellStartFiles(originals) if originals is not None else None
    record = WritesKeptApart(folder, notebook_temp, at_start)
    real_open, real_replace = builtins.open, os.replace

    def redirecting(open_fn: Any) -> Any:
        @functools.wraps(open_fn)
        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            # an opener decides what is opened (NamedTemporaryFile names its folder there)
            if kwargs.get("opener") is not None or (len(args) > 5 and args[5] is not None):
                return open_fn(file, mode, *args, **kwargs)
            seen = record.open_path(file, mode, real_open)
            if seen is not file or at_start is None:
                return open_fn(seen, mode, *args, **kwargs)
            # a real file: the kept run may change it between that look and this open (its
            # original is kept before it does), so look again once it is open
            try:
                opened = open_fn(seen, mode, *args, **kwargs)
            except FileNotFoundError:
                if not record.changed_by_kept_run(file):
                    raise
            else:
                if not record.changed_by_kept_run(file):
                    return opened
                opened.close()
            return open_fn(record.open_path(file, mode, real_open), mode, *args, **kwargs)

        return open_

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        # os.open (Path.touch, mkstemp and NamedTemporaryFile given a folder): as open() with the
        # mode its flags mean, the file opened with the flags as given. A file made new (O_EXCL:
        # mkstemp's) is made for real, under a name no other run takes, and is the run's own:
        # tempfile removes it by a name it bound before any run (NamedTemporaryFile's close).
        if kwargs.get("dir_fd") is not None or flags & _O_DIRECTORY:
            return real_os_open(path, flags, *args, **kwargs)  # a folder (O_TMPFILE's too)
        if flags & os.O_CREAT and flags & os.O_EXCL:
            handle = real_os_open(path, flags, *args, **kwargs)
            record.made_new(path)
            return handle
        seen = record.open_path(path, _mode_of(flags), real_open)
        if seen is not path:  # its copy, made here (O_TRUNC alone truncates a file it "has")
            flags |= os.O_CREAT
        return real_os_open(seen, flags, *args, **kwargs)

    def in_view(real: Any, carried_out: Any) -> Any:
        # os.replace/rename/remove/unlink: done in the run's view, or for real where it says so
        def call(*paths: Any, **kwargs: Any) -> None:
            if kwargs or not carried_out(*paths):
                real(*paths, **kwargs)

        return call

    def on_metadata(real: Any) -> Any:
        # os.chmod/utime: on the run's copy; a real file it did not write is left alone
        def call(path: Any, *args: Any, **kwargs: Any) -> None:
            target = path if kwargs.get("dir_fd") else record.changed_path(path)
            if target is not None:
                real(target, *args, **kwargs)

        return call

    def stat(path: Any, **kwargs: Any) -> Any:
        if kwargs.get("dir_fd"):
            return real_stat(path, **kwargs)
        seen = record.stat_path(path)
        if seen is not path or at_start is None:
            return real_stat(seen, **kwargs)
        try:  # looked at again afterwards, as a real file opened (see open_)
            found = real_stat(seen, **kwargs)
        except FileNotFoundError:
            if not record.changed_by_kept_run(path):
                raise
        else:
            if not record.changed_by_kept_run(path):
                return found
        return real_stat(record.stat_path(path), **kwargs)

    def rmtree(path: Any, ignore_errors: bool = False, onerror: Any = None, **kwargs: Any) -> None:
        # tempfile.TemporaryDirectory.cleanup() comes here too
        if kwargs.get("dir_fd") is None:
            try:
                if record.removed_tree(path):
                    return
            except OSError:
                if ignore_errors:
                    return
                if onerror is None:
                    raise
                onerror(os.rmdir, path, sys.exc_info())
                return
        real_rmtree(path, ignore_errors, onerror, **kwargs)

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("dir_fd") is not None or not record.made_folder(path):
            real_mkdir(path, *args, **kwargs)
            record.made_new(path, folder=True)

    def renamed(src: Any, dst: Any) -> bool:
        return record.renamed(src, dst, real_replace)

    # Folder listings (Path.iterdir; glob, Path.glob and os.walk through scandir) show the run's
    # view: a file it wrote is listed where it wrote it, though its bytes are elsewhere.
    def listdir(path: Any = None) -> list[Any]:
        view = record.folder_view(path)
        if view is None:
            return real_listdir(path)
        folder, own = view
        names = [n for n in real_listdir(path) if not record.hides(os.path.join(folder, n))]
        return names + sorted(set(own) - set(names))

    def scandir(path: Any = None) -> Any:
        view = record.folder_view(path)
        if view is None:
            return real_scandir(path)
        return _ViewedScandir(real_scandir(path), path, *view, record.hides)

    real_stat, real_rmtree, real_mkdir, real_os_open = os.stat, shutil.rmtree, os.mkdir, os.open
    real_listdir, real_scandir = os.listdir, os.scandir
    open_ = redirecting(real_open)
    patches = [
        (builtins, {"open": open_}),
        (io, {"open": open_}),
        (
            os,
            {
                "replace": in_view(real_replace, renamed),
                "rename": in_view(os.rename, renamed),
                "remove": in_view(os.remove, record.removed),
                "unlink": in_view(os.unlink, record.removed),
                "rmdir": in_view(os.rmdir, record.removed_folder),
                "open": os_open,
                "mkdir": mkdir,
                "stat": stat,
                "chmod": on_metadata(os.chmod),
                "utime": on_metadata(os.utime),
                "listdir": listdir,
                "scandir": scandir,
            },
        ),
        (shutil, {"rmtree": rmtree}),
    ]
    patches += _zip_writer_patches(lambda path: record.open_path(path, "wb", real_open))
    patches += _torchscript_writer_patches(lambda path: record.open_path(path, "wb", real_open))
    patches += _torchscript_reader_patches(lambda path: record.open_path(path, "rb", real_open))
    patches += _profiler_trace_patches(lambda path: record.open_path(path, "w", real_open))
    serialization = sys.modules.get("torch.serialization")
    torch = sys.modules.get("torch")
    real_load = getattr(serialization, "load", None)
    if real_load is not None and torch is not None and torch.load is real_load:

        @functools.wraps(real_load)
        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            # torch.load(path, mmap=True) maps the path itself, below Python
            if isinstance(f, str | os.PathLike):
                f = record.open_path(f, "rb", real_open)
            return real_load(f, *args, **kwargs)

        patches += [(serialization, {"load": load}), (torch, {"load": load})]
    patches += _safetensors_patches(record, real_open)
    try:
        with _patched(patches, namespace, redirecting):
            try:
                yield record
            finally:
                record.remove_what_it_made()
    finally:
        if record.folder_made:
            shutil.rmtree(folder, ignore_errors=True)


def _zip_writer_patches(path_for: Any) -> list[tuple[Any, Any]]:
    """torch.save's zip writer handed ``path_for(path)`` for a path (nothing: torch not loaded).

    torch.save hands a path to its C++ zip writer, which opens it below Python's ``open``.
    """
    serialization = sys.modules.get("torch.serialization")
    real_zip_writer = getattr(serialization, "_open_zipfile_writer", None)
    if real_zip_writer is None:
        return []

    def zip_writer(name_or_buffer: Any) -> Any:
        if isinstance(name_or_buffer, str | os.PathLike):
            name_or_buffer = path_for(name_or_buffer)
        return real_zip_writer(name_or_buffer)

    return [(serialization, {"_open_zipfile_writer": zip_writer})]


def _torchscript_writer_patches(path_for: Any) -> list[tuple[Any, Any]]:
    """A scripted module's archive writer handed ``path_for(path)`` (nothing: not loaded).

    ``torch.jit.save(model, path)`` and ``model.save(path)`` have TorchScript write the archive in
    C++, below Python's ``open``: every run wrote the notebook's file, and the last one won.
    """
    script = sys.modules.get("torch.jit._script")
    module_class = getattr(script, "RecursiveScriptModule", None)
    real_save = vars(module_class).get("save") if module_class is not None else None
    if real_save is None:
        return []

    def save(self: Any, f: Any, **kwargs: Any) -> Any:
        return real_save(self, path_for(f), **kwargs)

    return [(module_class, {"save": save})]


def _torchscript_reader_patches(path_for: Any) -> list[tuple[Any, Any]]:
    """``torch.jit.load`` handed ``path_for(path)`` for a path (nothing: torch.jit not loaded).

    TorchScript reads an archive given by its path in C++, below Python's ``open``.
    """
    serialization = sys.modules.get("torch.jit._serialization")
    real_load = getattr(serialization, "load", None)
    if real_load is None:
        return []

    @functools.wraps(real_load)
    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | os.PathLike):
            f = path_for(f)
        return real_load(f, *args, **kwargs)

    patches: list[tuple[Any, Any]] = [(serialization, {"load": load})]
    jit = sys.modules.get("torch.jit")
    if getattr(jit, "load", None) is real_load:
        patches.append((jit, {"load": load}))
    return patches


def _profiler_trace_patches(path_for: Any) -> list[tuple[Any, Any]]:
    """The profiler's trace writer handed ``path_for(path)`` (nothing: torch not loaded).

    ``prof.export_chrome_trace(path)``, and so ``tensorboard_trace_handler(folder)`` at each
    ``prof.step()`` of a training loop, has Kineto write the trace in C++, below Python's ``open``:
    every run left its trace in the notebook's folder, two runs' traces where a GPU writes one.
    """
    autograd = getattr(getattr(sys.modules.get("torch"), "_C", None), "_autograd", None)
    result = getattr(autograd, "_ProfilerResult", None)
    real_save = getattr(result, "save", None)
    if real_save is None:
        return []

    def save(self: Any, path: Any) -> Any:
        return real_save(self, os.fspath(path_for(path)))

    return [(result, {"save": save})]


@contextlib.contextmanager
def _patched(
    patches: list[tuple[Any, Any]],
    namespace: MutableMapping[str, Any] | None,
    wrapping: Any,
) -> Iterator[None]:
    """``patches`` applied, and the namespace's own ``open`` wrapped by ``wrapping``, for the body.

    A notebook's cells have an ``open`` of their own: IPython's wrapper in the kernel (it refuses
    the fds 0-2), the real one a worker received with the cell's values. Patching builtins does
    not reach it.
    """
    cell_open = namespace.get("open") if namespace is not None else None
    namespace_open = wrapping(cell_open) if callable(cell_open) else None
    with contextlib.ExitStack() as stack:
        for owner, replacements in patches:
            stack.enter_context(patched_attributes(owner, replacements))
        if namespace_open is not None:
            namespace["open"] = namespace_open  # type: ignore[index]
        try:
            yield
        finally:
            if namespace_open is not None and namespace.get("open") is namespace_open:  # type: ignore[union-attr]
                namespace["open"] = cell_open  # type: ignore[index]


#: Modules that bind safetensors' reader by name at import (``from safetensors import safe_open``):
#: a run reading back a file it wrote through them reads its own copy.
_SAFE_OPEN_HOLDERS = ("safetensors", "safetensors.torch", "transformers.modeling_utils")


def _safetensors_patches(record: WritesKeptApart, real_open: Any) -> list[tuple[Any, Any]]:
    """Patches that keep safetensors' files apart, when safetensors is loaded.

    safetensors writes and reads its files in Rust, below Python's ``open``: ``save_file`` (and so
    ``save_model`` and ``save_pretrained``) wrote the real file from both runs, and whichever ended
    last won. Its writer (``serialize_file``, looked up when ``save_file`` runs) and its reader
    (``safe_open``, where the modules in :data:`_SAFE_OPEN_HOLDERS` bind it) take the run's paths.
    """
    torch_api = sys.modules.get("safetensors.torch")
    real_writer = getattr(torch_api, "serialize_file", None)
    if real_writer is None:
        return []
    real_reader = torch_api.safe_open

    def serialize_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        return real_writer(tensors, record.open_path(filename, "wb", real_open), *args, **kwargs)

    def safe_open(filename: Any, *args: Any, **kwargs: Any) -> Any:
        return real_reader(record.open_path(filename, "rb", real_open), *args, **kwargs)

    patches: list[tuple[Any, Any]] = [(torch_api, {"serialize_file": serialize_file})]
    for name in _SAFE_OPEN_HOLDERS:
        module = sys.modules.get(name)
        if getattr(module, "safe_open", None) is real_reader:
            patches.append((module, {"safe_open": safe_open}))
    return patches


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
