"""One module per rule area; each declares its rules and the hooks that find them.

To add a rule, declare its :class:`~neuron_workbench.scan.rule.Rule` in the area's module, report
it from one of the area's hooks, and test it in ``tests/scan/checks/test_<area>.py``; the registry
(:mod:`neuron_workbench.scan.rules`) and the walk (:mod:`neuron_workbench.scan.analyzer`) pick it
up from :data:`AREAS`. A new area is a new module plus one line in :data:`AREAS`.
"""

from __future__ import annotations

from neuron_workbench.scan.checks import (
    amp,
    backend_flags,
    cuda_api,
    devices,
    distributed,
    dtypes,
    env,
    ints,
    kernels,
    libraries,
    runtime,
    torch_compile,
)
from neuron_workbench.scan.checks.base import TARGETS, Area, Fix, Scan

#: Every rule area, in the order their hooks run on each node. Order matters in two places: env
#: before devices (env claims environment-variable names in ``{...}`` entries, which then are not
#: device keys) and devices last (amp and runtime mark the calls whose device argument they check
#: themselves, which the generic ``device=`` check then skips).
AREAS: tuple[Area, ...] = (
    env.AREA,
    cuda_api.AREA,
    amp.AREA,
    backend_flags.AREA,
    distributed.AREA,
    torch_compile.AREA,
    kernels.AREA,
    libraries.AREA,
    dtypes.AREA,
    ints.AREA,
    runtime.AREA,
    devices.AREA,
)

__all__ = ["AREAS", "TARGETS", "Area", "Fix", "Scan"]
