"""run/ray_executor.py without a cluster: addresses, placement, shipped modules, one-line errors.

The cluster tests (a local Ray cluster, %%neuron --on ray://...) are in tests/magics/test_neuron_ray.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

from neuron_workbench.cell.options import CellOptions, CompareOptions
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run import ray_executor
from neuron_workbench.run.ray_executor import (
    RayOptions,
    _placement,
    _ray_cause,
    _seen,
    local_modules,
    module_sources,
    parse_cluster,
)


def test_cluster_addresses():
    assert parse_cluster("ray://10.0.0.5:10001") == "ray://10.0.0.5:10001"
    assert parse_cluster(" ray ") == "ray"
    assert parse_cluster("local") == parse_cluster("") == parse_cluster(None) == ""
    for bad in ("10.0.0.5:10001", "ray://", "http://x:1"):
        with pytest.raises(WorkbenchUsageError, match="--on takes ray://HOST:PORT"):
            parse_cluster(bad)


def test_resources_default_per_target_and_can_be_overridden():
    options = RayOptions()
    assert options.resources_for("neuron") == {"neuron_cores": 1.0}
    assert options.resources_for("tpu") == {"TPU": 1.0}
    assert options.resources_for("cuda") == {"GPU": 1.0}
    assert options.resources_for("cpu") == {}
    custom = RayOptions(resources={"neuron": {"neuron_cores": 2, "trn2": 1}, "tpu": {"TPU": 0}})
    assert custom.resources_for("neuron") == {"neuron_cores": 2.0, "trn2": 1.0}
    assert custom.resources_for("tpu") == {}  # an amount of 0 drops the resource
    with pytest.raises(WorkbenchUsageError, match="must map resource names to amounts"):
        RayOptions(resources={"neuron": 2}).validate()
    with pytest.raises(WorkbenchUsageError, match="ready timeout"):
        RayOptions(ready_timeout_s=0).validate()


def test_placement_uses_rays_keywords_for_gpu_and_cpu():
    assert _placement({"neuron_cores": 1.0}, None) == {"resources": {"neuron_cores": 1.0}}
    assert _placement({"GPU": 1.0}, 2.0) == {"num_cpus": 2.0, "num_gpus": 1.0}
    assert _placement({"TPU": 4.0, "CPU": 8.0}, None) == {
        "num_cpus": 8.0,
        "resources": {"TPU": 4.0},
    }


def test_cell_options_with_a_cluster_use_the_ray_executor():
    options = CellOptions(compare=CompareOptions(target="neuron"), cluster="ray://h:1")
    assert options.resolved_executor == "ray"
    options.validate()
    # two accelerators and --timeout are fine in actors, as in workers
    CellOptions(
        compare=CompareOptions(target="neuron"),
        extra_targets=("tpu",),
        cluster="ray",
        timeout=5.0,
    ).validate()
    with pytest.raises(WorkbenchUsageError, match="executor inprocess would run it here"):
        CellOptions(cluster="ray", executor="inprocess").validate()
    with pytest.raises(WorkbenchUsageError, match="names no Ray cluster"):
        CellOptions(cluster="local").validate()


def test_local_modules_are_the_notebooks_own(tmp_path, monkeypatch):
    (tmp_path / "nw_local_helpers.py").write_text("VALUE = 3\n")
    package = tmp_path / "nw_local_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("NAME = 'pkg'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import nw_local_helpers  # noqa: F401
    import nw_local_pkg  # noqa: F401

    try:
        found = local_modules([str(tmp_path)])
        assert found == sorted([str(tmp_path / "nw_local_helpers.py"), str(package)])
        # installed packages and the workbench itself never travel
        everything = local_modules()
        assert not any("site-packages" in path for path in everything)
        assert not any(path.endswith("neuron_workbench") for path in everything)
    finally:
        sys.modules.pop("nw_local_helpers", None)
        sys.modules.pop("nw_local_pkg", None)


def test_module_sources_travel_as_relative_files(tmp_path, monkeypatch):
    (tmp_path / "one.py").write_text("A = 1\n")
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "deep.py").write_text("B = 2\n")
    (package / "data.bin").write_bytes(b"\0" * 10)
    sources = module_sources([str(tmp_path / "one.py"), str(package)])
    assert sources == {
        "one.py": b"A = 1\n",
        os.path.join("pkg", "__init__.py"): b"",
        os.path.join("pkg", "sub", "deep.py"): b"B = 2\n",
    }
    monkeypatch.setattr(ray_executor, "MODULES_LIMIT_BYTES", 3)
    with pytest.raises(WorkbenchUsageError, match="install them on the cluster's nodes"):
        module_sources([str(tmp_path / "one.py")])


def test_actors_get_the_worker_marker_and_the_jobs_env_vars():
    slot = ray_executor.RayTarget(
        "neuron", "ray://h:1", RayOptions(runtime_env={"env_vars": {"A": "1"}, "pip": ["p"]})
    )
    assert slot._runtime_env() == {"env_vars": {"A": "1", "NEURON_WORKBENCH_WORKER": "neuron"}}
    assert ray_executor.RayTarget("tpu", "ray", RayOptions())._runtime_env() == {
        "env_vars": {"NEURON_WORKBENCH_WORKER": "tpu"}
    }


def test_where_a_run_was_last_seen():
    assert _seen(("aten::add.Tensor", 3)) == " while running aten::add.Tensor at cell line 3"
    assert _seen(("aten::mul.Tensor", None), last=True) == "; last seen running aten::mul.Tensor"
    assert _seen(("", None)) == ""


def test_ray_errors_become_one_line():
    class ActorDied(Exception):
        pass

    ActorDied.__module__ = "ray.exceptions"
    killed = ActorDied("The actor died because it was killed by `ray.kill`.\n  more\n  lines")
    assert _ray_cause(killed) == "ended with ray.kill"
    crashed = ActorDied(
        "The actor died unexpectedly before finishing this task.\n\tclass_name: TargetActor\n"
        "\tworker exit type: SYSTEM_ERROR exit detail: Worker unexpectedly exits with a "
        "connection error code 2. End of LOG file: ..."
    )
    assert _ray_cause(crashed) == ("Worker unexpectedly exits with a connection error code 2")
    wrapped = ActorDied("long text")
    wrapped.cause = ModuleNotFoundError("No module named 'neuron_workbench'")
    assert _ray_cause(wrapped) == "ModuleNotFoundError: No module named 'neuron_workbench'"


def test_without_ray_installed_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(WorkbenchUsageError) as info:
        ray_executor.connect("ray://127.0.0.1:1")
    assert str(info.value) == (
        "running a target on a Ray cluster needs Ray: pip install neuron-workbench[ray]"
    )
    assert "\n" not in str(info.value)


def test_on_ray_without_a_connected_cluster_is_a_usage_error():
    code = textwrap.dedent(
        """
        import sys
        from neuron_workbench.errors import WorkbenchUsageError
        from neuron_workbench.run.ray_executor import connect
        try:
            connect("ray")
        except WorkbenchUsageError as exc:
            print(exc)
        print("ray" in sys.modules)
        """
    )
    pytest.importorskip("ray", reason="Ray is not installed (pip install neuron-workbench[ray])")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("--on ray runs the target on the Ray cluster this kernel connected")
    assert lines[-1] == "False"  # not imported to say so


def test_a_client_server_that_dies_as_it_starts_is_tried_again(monkeypatch):
    calls = []

    class FakeRay(types.ModuleType):
        def is_initialized(self):
            return len(calls) == 2

        def init(self, address, **kwargs):
            calls.append(address)
            if len(calls) == 1:
                raise ConnectionAbortedError("Initialization failure from server:\n...")

        def shutdown(self):
            pass

    monkeypatch.setitem(sys.modules, "ray", FakeRay("ray"))
    monkeypatch.setattr(ray_executor, "_connected", None)
    assert ray_executor.connect("ray://127.0.0.1:1") is sys.modules["ray"]
    assert calls == ["ray://127.0.0.1:1"] * 2
    assert ray_executor.connected_address() == "ray://127.0.0.1:1"
