"""The notebook's own modules' marks (kernel side) and loading them again (worker side)."""

import importlib
import os
import sys
import time

from neuron_workbench.run import module_versions


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
