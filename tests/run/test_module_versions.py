"""The notebook's own modules' marks (kernel side) and loading them again (worker side)."""

import enum
import importlib
import os
import sys
import time

import numpy as np
import torch

from neuron_workbench.run import module_versions
from neuron_workbench.run.cell import compile_cell


def test_only_the_notebooks_own_modules_are_marked_and_a_reload_changes_the_mark(
    tmp_path, monkeypatch
):
    name = f"nw_marked_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        first = module_versions.loaded_versions()
        assert name in first
        # installed libraries, the workbench and torch.ops (a module with no file of its own) not
        assert not {"torch", "torch.ops", "os", "neuron_workbench"} & set(first)
        assert module_versions.loaded_versions()[name] == first[name]  # nothing loaded again
        importlib.reload(module)
        assert module_versions.loaded_versions()[name] != first[name]
    finally:
        sys.modules.pop(name, None)


def test_follow_loads_again_only_a_module_whose_mark_changed(tmp_path, monkeypatch):
    name = f"nw_followed_{os.getpid()}"
    source = tmp_path / f"{name}.py"
    source.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        module_versions.follow({name: 1})  # first seen: as it is
        source.write_text("VALUE = 2\n")
        os.utime(source, (time.time() + 5, time.time() + 5))
        module_versions.follow({name: 1})
        assert module.VALUE == 1
        module_versions.follow({name: 2})
        assert module.VALUE == 2
        source.write_text("VALUE = (\n")  # a file that cannot load: the module stays as it was
        os.utime(source, (time.time() + 10, time.time() + 10))
        module_versions.follow({name: 3})
        assert module.VALUE == 2
    finally:
        sys.modules.pop(name, None)
        module_versions._FOLLOWED.pop(name, None)


def test_a_module_imported_again_in_place_of_the_first_is_marked_anew(tmp_path, monkeypatch):
    # with as many modules loaded as at the last look, only the known own modules are looked at:
    # one deleted from sys.modules and imported again is a new module all the same
    name = f"nw_replaced_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    try:
        first = module_versions.loaded_versions()[name]
        del sys.modules[name]
        importlib.import_module(name)
        assert module_versions.loaded_versions()[name] != first
    finally:
        sys.modules.pop(name, None)


def test_a_module_of_settings_loaded_again_changes_its_mark(tmp_path, monkeypatch):
    # a config module (no function, no class) had one mark whatever it held: the worker kept the
    # old learning rate after the notebook edited and reloaded it
    name = f"nw_settings_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("LR = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        first = module_versions.loaded_versions()[name]
        importlib.reload(module)
        assert module_versions.loaded_versions()[name] != first
    finally:
        sys.modules.pop(name, None)


def test_follow_loads_a_module_again_after_the_modules_it_imports(tmp_path, monkeypatch):
    # `models` imports `layers` (and so comes first in sys.modules): loaded again first, it bound
    # the old Block, and only then was `layers` loaded again
    stem = f"nw_order_{os.getpid()}"
    layers, models = f"{stem}_layers", f"{stem}_models"
    (tmp_path / f"{layers}.py").write_text("class Block:\n    width = 1\n")
    (tmp_path / f"{models}.py").write_text(f"from {layers} import Block\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(models)
    try:
        module_versions.follow({models: 1, layers: 1})
        (tmp_path / f"{layers}.py").write_text("class Block:\n    width = 2\n")
        os.utime(tmp_path / f"{layers}.py", (time.time() + 5, time.time() + 5))
        module_versions.follow({models: 2, layers: 2})
        assert sys.modules[models].Block.width == 2
    finally:
        for name in (models, layers):
            sys.modules.pop(name, None)
            module_versions._FOLLOWED.pop(name, None)


def test_the_attributes_a_cell_assigns_on_the_notebooks_own_modules_are_noted(
    tmp_path, monkeypatch
):
    name = f"nw_assigned_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "LR = 0.1\nCFG = {'lr': 0.1}\nSTEPS = 0\nA = B = 0\nOPT = 'sgd'\n_ready = False\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    namespace = {"config": module, "torch": torch, "C": type("C", (), {"n": 0})}
    try:
        cell = (
            "config.LR = 0.5\n"
            "config.STEPS += 1\n"
            "config.CFG['lr'] = 0.5\n"
            "config.A, config.B = 1, 2\n"
            "setattr(config, 'OPT', 'adam')\n"
            "def configure(steps):\n"  # a function of the notebook's that sets one
            "    config.WARMUP = steps\n"
            "torch.backends.cudnn.benchmark = False\n"  # no module of the notebook's
            "C.n += 1\n"  # no module
            "del config._ready\n"  # nothing left to send
        )
        noted = module_versions.remember_assigned_attributes(cell, namespace)
        assert sorted(noted) == [
            f"{name}.{a}" for a in ("A", "B", "CFG", "LR", "OPT", "STEPS", "WARMUP")
        ]
        assert module_versions.remember_assigned_attributes(cell, namespace) == []  # once
        # read at no cost where nothing assigns an attribute
        assert module_versions.remember_assigned_attributes("x = config.LR * 2", namespace) == []
    finally:
        sys.modules.pop(name, None)
        module_versions._ASSIGNED.pop(name, None)


def test_assigned_values_are_plain_data_copied_and_set_where_they_differ(tmp_path, monkeypatch):
    name = f"nw_values_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("LR = 0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        module.LR = 0.5
        module.LAYERS = [64, (32, "relu")]
        module.DTYPE = torch.bfloat16
        module.TABLE = torch.zeros(2)  # no plain data: not sent
        module.MODE = enum.Enum("Mode", "A B").B  # an enum member, a NumPy scalar: sent
        module.EPS = np.float64(1e-5)
        # a dataset, not a setting: not copied and sent with every cell (half a second each)
        module.DATA = list(range(3_000_000))
        assigned = ["LR", "LAYERS", "DTYPE", "TABLE", "MODE", "EPS", "DATA", "GONE"]
        module_versions._ASSIGNED[name] = dict.fromkeys(assigned)
        values = module_versions.assigned_values()
        assert values[name] == {
            "LR": 0.5,
            "LAYERS": [64, (32, "relu")],
            "DTYPE": torch.bfloat16,
            "MODE": module.MODE,
            "EPS": np.float64(1e-5),
        }
        assert values[name]["LAYERS"] is not module.LAYERS  # as it was when read
        module.LR, module.LAYERS, module.DTYPE = 0.1, [], torch.float32  # a worker's copy
        module_versions.take_assigned_values(values)
        assert (module.LR, module.LAYERS, module.DTYPE) == (0.5, [64, (32, "relu")], torch.bfloat16)
        module_versions.take_assigned_values({f"{name}_not_loaded": {"LR": 1.0}})
        assert f"{name}_not_loaded" not in sys.modules
    finally:
        sys.modules.pop(name, None)
        module_versions._ASSIGNED.pop(name, None)


def test_the_submodules_a_cell_names_on_the_notebooks_own_package_are_reached(
    tmp_path, monkeypatch
):
    package = f"nw_reached_{os.getpid()}"
    # (ns/tools.py: a folder without __init__.py, a namespace package)
    files = [
        "__init__.py",
        "train.py",
        "eval.py",
        "sub/__init__.py",
        "sub/deeper.py",
        "ns/tools.py",
    ]
    for path in files:
        (tmp_path / package / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / package / path).write_text("LR = 0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ["train", "eval", "sub.deeper", "ns.tools"]:
        importlib.import_module(f"{package}.{name}")
    try:
        pkg, sub, ns = (sys.modules[f"{package}{part}"] for part in ["", ".sub", ".ns"])
        body = compile_cell("def f():\n    return pkg.sub.deeper.LR\nlr = pkg.train.LR\nf()")
        # the parts a cell names after the package (a function's it defines too), not eval
        assert module_versions.reached_submodules(body, {"pkg": pkg}) == [
            f"{package}.sub",
            f"{package}.sub.deeper",
            f"{package}.train",
        ]
        # through a submodule bound to a name (import nwpkg.sub as s); its last expression too
        reading = compile_cell("s.deeper.LR")
        assert module_versions.reached_submodules(reading, {"s": sub, "torch": torch}) == [
            f"{package}.sub.deeper"
        ]
        assert module_versions.reached_submodules(compile_cell("ns.tools.LR"), {"ns": ns}) == [
            f"{package}.ns.tools"
        ]
        # installed packages (torch.nn named by the cell) are not the notebook's own
        assert (
            module_versions.reached_submodules(compile_cell("torch.nn.Linear"), {"torch": torch})
            == []
        )
        # a target process where only the packages were imported imports the others
        for parent, name in [(pkg, "train"), (sub, "deeper")]:
            del sys.modules[f"{parent.__name__}.{name}"]
            delattr(parent, name)
        module_versions.import_submodules([f"{package}.train", f"{package}.sub.deeper", "nw_gone"])
        assert (pkg.train.LR, pkg.sub.deeper.LR) == (0.1, 0.1)
        assert "nw_gone" not in sys.modules
    finally:
        for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
            sys.modules.pop(name)
