"""The emulator's native core: a compiled PrivateUse1 backend on host memory (``emucore.cpp``).

Built once per torch version and source, on first use or by ``python -m
neuron_workbench.emulator.native`` (``scripts/setup_env.sh`` runs that), into a cache directory
(``$NEURON_WORKBENCH_CACHE`` or ``~/.cache/neuron-workbench``); later processes load the built
module directly. Building needs a C++ compiler (``g++`` or ``clang++``) and ``ninja`` (a dependency
of the package). Without them the emulator uses its pure-Python core and says why in one line
(:func:`unavailable_reason`); ``NEURON_WORKBENCH_EMULATOR_CORE=python`` chooses that core on purpose.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import torch

NAME = "neuron_workbench_emucore"
SOURCE = Path(__file__).with_name("emucore.cpp")
CORE_ENV = "NEURON_WORKBENCH_EMULATOR_CORE"

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

    Raises
    ------
    RuntimeError
        With one line saying what is missing, when the build cannot run or fails.
    """
    directory = build_dir()
    path = _built_path(directory)
    if path.exists() and not (directory / "lock").exists():  # "lock": another build is running
        return _import(path)
    missing = _missing_tools()
    if missing:
        raise RuntimeError(f"cannot build the emulator's native core: {missing}")
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
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
            _module = _import(path)
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
