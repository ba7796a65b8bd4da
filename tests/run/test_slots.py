"""run/slots.py: both kinds of slot implement the one protocol; a pool keeps one slot per target."""

from __future__ import annotations

from neuron_workbench.run.ray_cluster import RayOptions
from neuron_workbench.run.ray_executor import RayActorPool, RayActorSlot, RayExecutor
from neuron_workbench.run.slot_executor import SlotExecutor
from neuron_workbench.run.slots import SlotPool, TargetSlot, WorkerRow
from neuron_workbench.run.worker_process import WorkerExecutor, WorkerPool, WorkerSlot


def test_worker_and_ray_actor_slots_implement_the_target_slot_protocol():
    # runtime_checkable: every member of the protocol, methods and attributes, must be present
    assert isinstance(WorkerSlot("neuron"), TargetSlot)
    assert isinstance(RayActorSlot("neuron", "ray://h:1", RayOptions()), TargetSlot)
    # neither is the other: both executors and pools are the generic ones over their own slots
    assert not issubclass(RayActorSlot, WorkerSlot) and not issubclass(WorkerSlot, RayActorSlot)
    assert not issubclass(RayActorPool, WorkerPool) and issubclass(RayActorPool, SlotPool)
    assert not issubclass(RayExecutor, WorkerExecutor) and issubclass(RayExecutor, SlotExecutor)
    assert (WorkerExecutor.concurrent, RayExecutor.concurrent) == (True, False)


def test_a_pool_keeps_one_slot_per_target_and_lists_them_unstarted():
    pool = WorkerPool()
    slot = pool.get("neuron")
    assert pool.get("neuron") is slot and pool.get("tpu") is not slot
    assert pool.rows() == [
        WorkerRow("neuron", None, False, None, 0),
        WorkerRow("tpu", None, False, None, 0),
    ]
    actors = RayActorPool("ray://h:1")
    assert actors.rows() == []
    assert actors.get("tpu").row() == WorkerRow("tpu@ray://h:1", None, False, None, 0)
    actors.options = RayOptions(num_cpus=2)
    assert actors.get("tpu").options.num_cpus == 2  # the session's settings reach the slot
