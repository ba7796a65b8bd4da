"""Building and finding the native core (``python -m neuron_workbench.emulator.native``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from neuron_workbench.emulator import native


def test_build_dir_is_keyed_by_python_torch_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_WORKBENCH_CACHE", str(tmp_path))
    directory = native.build_dir()
    assert directory.parent == tmp_path
    assert f"torch{torch.__version__}" in directory.name
    assert f"py{sys.version_info[0]}{sys.version_info[1]}" in directory.name


def test_describe_says_which_core_without_building(monkeypatch, tmp_path):
    assert native.describe().startswith("native core (built: ")  # set-up built it
    monkeypatch.setenv(native.CORE_ENV, "python")
    assert native.describe() == f"pure-Python core ({native.CORE_ENV}=python)"
    monkeypatch.delenv(native.CORE_ENV)
    monkeypatch.setenv("NEURON_WORKBENCH_CACHE", str(tmp_path))  # nothing built there
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CXX", "")
    assert native.describe() == "pure-Python core: no C++ compiler found (install g++ or clang++)"


def test_module_command_prints_the_built_module():
    r = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.emulator.native"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("emulator native core: ") and str(native.build_dir()) in r.stdout


def test_module_command_without_a_compiler_says_what_to_install(tmp_path):
    env = {"PATH": str(tmp_path), "NEURON_WORKBENCH_CACHE": str(tmp_path), "CXX": ""}
    r = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.emulator.native"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "cannot build the emulator's native core: no C++ compiler found (install g++ or "
        "clang++); the emulator will use its pure-Python core"
    )


# ---- the build lock ------------------------------------------------------------------------------

HOLD_LOCK = """
import fcntl, os, shutil, sys, time
lock, ready, built = sys.argv[1:4]
fd = os.open(lock, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
if ready:  # a build that finishes once the other process waits for it
    while not os.path.exists(ready):
        time.sleep(0.05)
    time.sleep(1.0)
    shutil.copy(built, os.path.join(os.path.dirname(lock), os.path.basename(built)))
else:
    time.sleep(120)
"""

LOADER = """
import os, sys, time
from neuron_workbench.emulator import native
open(sys.argv[1], "w").close()  # ready: torch is imported
t0 = time.monotonic()
module = native.build()
print(module.__file__, time.monotonic() - t0)
"""


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _built_module() -> str:
    from neuron_workbench.emulator import _core

    if _core.NATIVE_CORE is None:
        pytest.skip("needs the emulator's native core (python -m neuron_workbench.emulator.native)")
    return _core.NATIVE_CORE.__file__


def _env(cache, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != native.WAIT_ENV}
    env.update(NEURON_WORKBENCH_CACHE=str(cache), **extra)
    return env


def _hold_lock(directory, ready="", built="") -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(directory / native.LOCK_NAME), ready, built],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.slow  # the suite's one build from scratch (~40 s)
def test_builds_after_a_stale_lock_within_a_minute(monkeypatch, tmp_path):
    # A process killed mid-build left torch's lock file (torch waits on it forever) and ours.
    monkeypatch.setenv("NEURON_WORKBENCH_CACHE", str(tmp_path))
    directory = native.build_dir()
    directory.mkdir(parents=True)
    (directory / "lock").touch()
    (directory / native.LOCK_NAME).write_text(f"{_dead_pid()}\n")
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "neuron_workbench.emulator.native"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(tmp_path),
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("emulator native core: ") and str(directory) in r.stdout
    assert elapsed < 150, f"the build took {elapsed:.0f} s"  # ~30-60 s on 2 busy cores
    assert not (directory / "lock").exists()


def test_a_built_module_loads_at_once_despite_stale_locks(monkeypatch, tmp_path):
    built = _built_module()
    env = _env(tmp_path)
    monkeypatch.setenv("NEURON_WORKBENCH_CACHE", str(tmp_path))
    directory = native.build_dir()
    directory.mkdir(parents=True)
    shutil.copy(built, directory)
    (directory / "lock").touch()  # torch's, left by a killed build
    (directory / native.LOCK_NAME).write_text(f"{_dead_pid()}\n")
    r = subprocess.run(
        [sys.executable, "-c", LOADER, str(tmp_path / "ready")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    path, seconds = r.stdout.split()
    assert os.path.dirname(path) == str(directory) and float(seconds) < 5
    assert not (directory / "build.ninja").exists()  # loaded, not rebuilt


def test_a_live_build_is_waited_for_and_its_module_loaded(monkeypatch, tmp_path):
    built = _built_module()
    env = _env(tmp_path, **{native.WAIT_ENV: "60"})
    monkeypatch.setenv("NEURON_WORKBENCH_CACHE", str(tmp_path))
    directory = native.build_dir()
    directory.mkdir(parents=True)
    ready = tmp_path / "ready"
    holder = _hold_lock(directory, str(ready), built)
    try:
        r = subprocess.run(
            [sys.executable, "-c", LOADER, str(ready)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        holder.kill()
        holder.communicate()
    assert r.returncode == 0, r.stderr[-2000:]
    path, seconds = r.stdout.split()
    assert os.path.dirname(path) == str(directory)
    assert 0.5 < float(seconds) < 30  # it waited for the other build, then loaded its module
    assert not (directory / "build.ninja").exists()


def test_a_live_build_lock_times_out_with_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv(native.WAIT_ENV, "1")
    directory = native.build_dir()
    directory.mkdir(parents=True)
    holder = _hold_lock(directory)
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as caught:
            native.build()
        elapsed = time.monotonic() - t0
    finally:
        holder.kill()
        holder.communicate()
    message = str(caught.value)
    assert "\n" not in message
    assert f"another process (pid {holder.pid}) is building" in message
    assert str(directory / native.LOCK_NAME) in message and native.WAIT_ENV in message
    assert elapsed < 10
    assert not (directory / "build.ninja").exists()
