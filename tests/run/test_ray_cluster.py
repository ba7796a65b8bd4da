"""run/ray_cluster.py without a cluster: addresses, resources, placement, shipped modules, connecting.

The cluster tests (a local Ray cluster, %%neuron --on ray://...) are in tests/magics/test_neuron_ray.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run import ray_cluster
from neuron_workbench.run.ray_cluster import (
    RayOptions,
    actor_placement,
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
    assert actor_placement({"neuron_cores": 1.0}, None) == {"resources": {"neuron_cores": 1.0}}
    assert actor_placement({"GPU": 1.0}, 2.0) == {"num_cpus": 2.0, "num_gpus": 1.0}
    assert actor_placement({"TPU": 4.0, "CPU": 8.0}, None) == {
        "num_cpus": 8.0,
        "resources": {"TPU": 4.0},
    }


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
    monkeypatch.setattr(ray_cluster, "MODULES_LIMIT_BYTES", 3)
    with pytest.raises(WorkbenchUsageError, match="install them on the cluster's nodes"):
        module_sources([str(tmp_path / "one.py")])


def test_without_ray_installed_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(WorkbenchUsageError) as info:
        ray_cluster.connect("ray://127.0.0.1:1")
    assert str(info.value) == (
        "running a target on a Ray cluster needs Ray: pip install neuron-workbench[ray]"
    )
    assert "\n" not in str(info.value)


def test_on_ray_without_a_connected_cluster_is_a_usage_error():
    code = textwrap.dedent(
        """
        import sys
        from neuron_workbench.errors import WorkbenchUsageError
        from neuron_workbench.run.ray_cluster import connect
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
    monkeypatch.setattr(ray_cluster, "_connected", None)
    assert ray_cluster.connect("ray://127.0.0.1:1") is sys.modules["ray"]
    assert calls == ["ray://127.0.0.1:1"] * 2
    assert ray_cluster.connected_address() == "ray://127.0.0.1:1"
