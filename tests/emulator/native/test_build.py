"""Building and finding the native core (``python -m neuron_workbench.emulator.native``)."""

from __future__ import annotations

import subprocess
import sys

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
