"""IPython magics. This layer (and :mod:`neuron_workbench.testing`) is the only one importing IPython."""

from __future__ import annotations

import importlib
from typing import Any

#: Magics classes registered by ``%load_ext neuron_workbench``, as (module, class name).
MAGICS = (
    ("neuron_workbench.magics.neuron", "NeuronMagics"),
    ("neuron_workbench.magics.scan", "ScanMagics"),
)


def register(shell: Any) -> None:
    """Register every workbench magic on ``shell`` and make it configurable with ``%config``.

    With the in-process executor, the default target's emulated device (if it will be emulated) is
    installed right away: PyTorch's autograd engine only learns about devices registered before its
    first backward pass. With the worker executor the kernel installs nothing.
    """
    from neuron_workbench.run.custom_ops import remember_custom_op_definitions
    from neuron_workbench.run.remap import (
        remember_autocast_requests,
        remember_grad_scaler_requests,
    )
    from neuron_workbench.run.torch_settings import (
        remember_chosen_precision,
        remember_dynamo_resets,
    )
    from neuron_workbench.run.transport import remember_compile_requests

    # autocast decorators the notebook builds from now on can be entered as meant in a run
    remember_autocast_requests()
    # and so can a GradScaler built for cuda, which torch turns off here without CUDA
    remember_grad_scaler_requests()
    # an op the notebook defines with torch.library.custom_op can be defined in a target's process
    remember_custom_op_definitions()
    instances = []
    # `%reload_ext neuron_workbench` registers the magics again: what they had before goes
    previous = {name: shell.magics_manager.registry.get(name) for _, name in MAGICS}
    for module_name, class_name in MAGICS:
        cls = getattr(importlib.import_module(module_name), class_name)
        instance = cls(shell=shell)
        shell.register_magics(instance)
        if previous[class_name] in shell.configurables:
            shell.configurables.remove(previous[class_name])
        if instance not in shell.configurables:
            shell.configurables.append(instance)
        instances.append(instance)
    if previous["NeuronMagics"] is not None:
        # The notebook's session goes on: with a new one, the old one's worker processes ran on
        # out of %neuron_workers' reach, and what earlier cells had put on the device was
        # forgotten, so the next cell's target computed with it on the CPU ("nothing ran").
        instances[0].session = previous["NeuronMagics"].session
    from neuron_workbench.magics.neuron import prepare_target

    # a plain cell's moves to the CPU (model.cpu()), and what it computes on the device, hold for
    # the next %%neuron cell
    for event, name in (
        ("pre_run_cell", "before_plain_cell"),
        ("post_run_cell", "after_plain_cell"),
    ):
        callbacks = shell.events.callbacks[event]
        callbacks[:] = [c for c in callbacks if getattr(c, "__name__", "") != name]
        shell.events.register(event, getattr(instances[0], name))

    prepare_target(instances[0].target, instances[0].executor)
    # ... and a worker's device is made ready meanwhile, in its process
    instances[0].launch_workers()
    # functions and modules the notebook compiles from now on can travel to a target's process,
    # compiled again there (after prepare_target: an emulated torch.compile here stays inside)
    remember_compile_requests()
    # a float32 matmul precision the notebook sets from now on travels even at torch's default
    remember_chosen_precision()
    # a reset of Dynamo's caches in a plain cell resets a target process's too (counted once
    # Dynamo is loaded: here, or by the notebook's first torch.compile)
    remember_dynamo_resets()
