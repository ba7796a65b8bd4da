"""run/ray_executor.py without a cluster: the actor slot's settings, where a run was seen, one-line errors.

The cluster tests (a local Ray cluster, %%neuron --on ray://...) are in tests/magics/test_neuron_ray.py.
"""

from __future__ import annotations

import pytest

from neuron_workbench.cell.settings import CellOptions, CompareOptions
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run.ray_cluster import RayOptions
from neuron_workbench.run.ray_executor import RayActorSlot, _ray_cause, _seen


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


def test_actors_get_the_worker_marker_and_the_jobs_env_vars():
    slot = RayActorSlot(
        "neuron", "ray://h:1", RayOptions(runtime_env={"env_vars": {"A": "1"}, "pip": ["p"]})
    )
    assert slot._runtime_env() == {"env_vars": {"A": "1", "NEURON_WORKBENCH_WORKER": "neuron"}}
    assert RayActorSlot("tpu", "ray", RayOptions())._runtime_env() == {
        "env_vars": {"NEURON_WORKBENCH_WORKER": "tpu"}
    }


def test_where_a_run_was_last_seen():
    assert _seen(("aten::add.Tensor", 3, False)) == " while running aten::add.Tensor at cell line 3"
    assert _seen(("aten::add.Tensor", 3, True)) == " at cell line 3, after running aten::add.Tensor"
    assert (
        _seen(("aten::mul.Tensor", None, False), last=True)
        == "; last seen while running aten::mul.Tensor"
    )
    assert _seen(("aten::mul.Tensor", None, True)) == " after running aten::mul.Tensor"
    assert _seen(("", 4, True), last=True) == "; last seen at cell line 4"
    assert _seen(("", None, False)) == ""
    # a script's program is compiled under its own path: its line reads as the script's
    assert _seen(("", 4, True), last=True, filename="train.py") == "; last seen at train.py, line 4"
    assert _seen(("", 4, True), filename="<neuron-cell-2>") == " at cell line 4"


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
