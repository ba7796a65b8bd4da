"""The emulator's native core: a compiled PrivateUse1 backend on host memory (``emucore.cpp``).

Built once per torch version and source, on first use or by ``python -m
neuron_workbench.emulator.native`` (``scripts/setup_env.sh`` runs that), into a cache directory
(``$NEURON_WORKBENCH_CACHE`` or ``~/.cache/neuron-workbench``); later processes load the built
module directly. Building needs a C++ compiler (``g++`` or ``clang++``) and ``ninja`` (a dependency
of the package). Without them the emulator uses its pure-Python core and says why in one line
(:func:`unavailable_reason`); ``NEURON_WORKBENCH_EMULATOR_CORE=python`` chooses that core on purpose.

Concurrent builds (several workers starting at once) are serialised by an ``flock`` on
``build.lock`` in the build directory, which the OS releases when its owner dies; a process waits
for another's build at most ``NEURON_WORKBENCH_BUILD_WAIT_S`` seconds (default
:data:`BUILD_WAIT_S`). Torch's own lock file there (``lock``), which a process killed mid-build
leaves behind and torch waits on forever, is removed by whoever holds ours.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: torch's own lock only
    fcntl = None  # type: ignore[assignment]

NAME = "neuron_workbench_emucore"
SOURCE = Path(__file__).with_name("emucore.cpp")
CORE_ENV = "NEURON_WORKBENCH_EMULATOR_CORE"
#: The longest a process waits for another process's build of the core, in seconds (a fresh
#: build takes about a minute on two busy cores).
BUILD_WAIT_S = 300.0
WAIT_ENV = "NEURON_WORKBENCH_BUILD_WAIT_S"
LOCK_NAME = "build.lock"  # ours; torch's cpp_extension uses "lock"
_POLL_S = 0.2

_module: ModuleType | None = None
_reason: str | None = None


def build_dir() -> Path:
    """Where the module for this torch, this Python and this source is (or will be) built."""
    root = os.environ.get("NEURON_WORKBENCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "neuron-workbench"
    )
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}-{digest}"
    return Path(root) / f"emucore-{tag}"


def _built_path(directory: Path) -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for candidate in (directory / f"{NAME}.so", directory / f"{NAME}{suffix}"):
        if candidate.exists():
            return candidate
    return directory / f"{NAME}.so"


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[NAME] = module
    return module


def _import_built(path: Path) -> ModuleType:
    try:
        return _import(path)
    except (ImportError, OSError) as exc:  # e.g. a file cut short by a killed linker
        raise RuntimeError(
            f"the emulator's native core at {path} cannot be loaded ({exc}); delete "
            f"{path.parent} to rebuild it"
        ) from exc


def _wait_limit() -> float:
    try:
        return max(0.0, float(os.environ.get(WAIT_ENV, "")))
    except ValueError:
        return BUILD_WAIT_S


def _build_running(directory: Path) -> bool:
    """Whether another process holds the build lock now (never waits, never creates files)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file: nobody has built here with the lock
        return False
    try:
        # Shared: loaders never block one another, only a builder's exclusive lock blocks them.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without flock: no builder could hold it either
        return False
    finally:
        os.close(fd)  # also releases the lock
    return False


def _owner(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "unknown pid"


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold the build lock of ``directory``, waiting at most :func:`_wait_limit` seconds for it."""
    if fcntl is None:
        yield
        return
    path = directory / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # e.g. a read-only cache
        raise RuntimeError(
            f"cannot build the emulator's native core: cannot open {path} ({exc.strerror})"
        ) from exc
    try:
        deadline = time.monotonic() + _wait_limit()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"another process ({_owner(path)}) is building the emulator's native "
                        f"core and holds {path}; gave up after {_wait_limit():g} s (wait for "
                        f"it, end it, or set {WAIT_ENV} to wait longer)"
                    ) from None
                time.sleep(_POLL_S)
            except OSError:  # a file system without flock: build as torch alone would
                break
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message above, in others
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a waiter)


def _missing_tools() -> str | None:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler and not shutil.which("clang++"):
        return "no C++ compiler found (install g++ or clang++)"
    scripts = sysconfig.get_path("scripts")
    if not shutil.which("ninja") and scripts and os.path.isfile(os.path.join(scripts, "ninja")):
        # The ninja wheel (a dependency) sits beside this interpreter, which may not be on PATH
        # (.venv/bin/python run directly); torch's builder looks for ninja on PATH.
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    try:
        from torch.utils.cpp_extension import is_ninja_available
    except ImportError:  # pragma: no cover - every supported torch has it
        return None
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def build(verbose: bool = False) -> ModuleType:
    """Compile the core (if it is not built yet) and load it.

    A built core loads at once unless another process is building it; then (as before a build)
    this waits for that build, at most ``$NEURON_WORKBENCH_BUILD_WAIT_S`` seconds (default
    :data:`BUILD_WAIT_S`), and loads what it built.

    Raises
    ------
    RuntimeError
        With one line saying what is missing, when the build cannot run or fails, or which
        process holds the build lock when the wait runs out.
    """
    directory = build_dir()
    path = _built_path(directory)
    if path.exists() and not _build_running(directory):
        return _import_built(path)
    if not path.exists():
        missing = _missing_tools()
        if missing:  # before creating anything in the cache
            raise RuntimeError(f"cannot build the emulator's native core: {missing}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeError(
            f"cannot build the emulator's native core: cannot create {directory} ({exc.strerror})"
        ) from exc
    with _build_lock(directory):
        path = _built_path(directory)
        if path.exists():  # another process built it while this one waited
            return _import_built(path)
        return _compile(directory, verbose)


def _compile(directory: Path, verbose: bool) -> ModuleType:
    # Called with the build lock held.
    missing = _missing_tools()  # (also puts the ninja wheel on PATH)
    if missing:
        raise RuntimeError(f"cannot build the emulator's native core: {missing}")
    from torch.utils.cpp_extension import load

    # Every builder holds our lock, so torch's lock file here was left by a process that died
    # mid-build; torch would wait for it forever.
    with contextlib.suppress(FileNotFoundError):
        (directory / "lock").unlink()
    try:
        module = load(
            name=NAME,
            sources=[str(SOURCE)],
            build_directory=str(directory),
            extra_cflags=["-O2"],
            verbose=verbose,
        )
    except Exception as exc:  # the compiler's output went to stderr
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"building the emulator's native core failed: {first}") from exc
    sys.modules[NAME] = module
    return module


def load(build_if_missing: bool = True) -> ModuleType | None:
    """The native core, or None (see :func:`unavailable_reason`) when it cannot be had."""
    global _module, _reason
    if _module is not None:
        return _module
    choice = os.environ.get(CORE_ENV, "auto").strip().lower()
    if choice == "python":
        _reason = f"{CORE_ENV}=python"
        return None
    try:
        if build_if_missing:
            _module = build()
        else:
            path = _built_path(build_dir())
            if not path.exists():
                _reason = (
                    "the native core is not built (python -m neuron_workbench.emulator.native)"
                )
                return None
            _module = _import_built(path)
    except RuntimeError as exc:
        _reason = str(exc)
        if choice == "native":
            raise
        return None
    return _module


def describe() -> str:
    """One line for ``doctor``: which core an emulated device would use here, without building."""
    if os.environ.get(CORE_ENV, "auto").strip().lower() == "python":
        return f"pure-Python core ({CORE_ENV}=python)"
    path = _built_path(build_dir())
    if path.exists():
        return f"native core (built: {path})"
    missing = _missing_tools()
    if missing:
        return f"pure-Python core: {missing}"
    return "native core (not built yet: built on first use, or by python -m neuron_workbench.emulator.native)"


def unavailable_reason() -> str | None:
    """Why :func:`load` returned None, in one line (None when the core loaded or was not tried)."""
    return _reason
