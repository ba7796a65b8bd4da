"""``--compile-check``: the cell once more with ``torch.compile`` made a no-op, on both sides.

A compiled cell's difference can come from the port (an op, a dtype rule of the target) or from
the compilers (Inductor's fused kernels on the reference reorder sums; a device compiler does the
same on its side). Running the same cell eagerly on both backends separates the two: a cell that
fails compiled and passes eager differs because of the compilers.

"Made a no-op" is ``torch.compiler.set_stance("force_eager")`` for the run: every compiled function
and module runs its Python eagerly, those compiled by an earlier cell too, and nothing is traced.
``torch.compile`` itself still returns its wrapper (a module keeps its ``_orig_mod`` paths), so the
eager runs' outputs have the compiled runs' names. The reference and the target both run eagerly
(the emulated target's compiled graphs run op by op, so its compiled numerics are its eager ones;
comparing it with the compiled reference would not tell the compilers apart).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from neuron_workbench.run import logging_setup
from neuron_workbench.run.executor import RunSpec, execute
from neuron_workbench.run.records import Run

__all__ = ["EAGER_RUN_IDS", "compile_off", "eager_instrument", "eager_runs", "eager_spec"]

#: The run ids of the eager runs (their printed output is kept apart from the compiled runs').
EAGER_RUN_IDS = ("eager:ref", "eager:target")


@contextlib.contextmanager
def compile_off() -> Iterator[None]:
    """For the body: every ``torch.compile``'d function or module runs eagerly, nothing compiles.

    Dynamo is not imported for this: a process that has not imported it has compiled nothing, and
    these reruns follow a run of the same cell (which imported it if the cell compiles).
    """
    if "torch._dynamo" not in sys.modules:
        yield
        return
    import torch.compiler

    with torch.compiler.set_stance("force_eager"):
        yield


def eager_instrument(backend: Any) -> contextlib.AbstractContextManager[None]:
    """A run instrument (``RunSpec.instruments``) running the cell with ``torch.compile`` off."""
    return compile_off()


def eager_spec(spec: RunSpec) -> RunSpec:
    """``spec`` with ``torch.compile`` off: the same program, namespace, seed and instruments."""
    eager = RunSpec(
        spec.program,
        spec.namespace,
        seed=spec.seed,
        random_state=spec.random_state,
        hidden=spec.hidden,
        resident=spec.resident,
        capture=spec.capture,
        instruments={**spec.instruments, "compile_off": eager_instrument},
        rng_on_cpu=spec.rng_on_cpu,
        steps=spec.steps,
        isolate_inputs=spec.isolate_inputs,
        ref_precision=spec.ref_precision,
        kept_run=spec.kept_run,
        default_device=spec.default_device,
        torch_settings=spec.torch_settings,
        notebook_temp=spec.notebook_temp,
        originals=spec.originals,
        entropy=spec.entropy,
    )
    eager.captured = spec.captured  # what the eager runs print is kept under their own ids
    return eager


def eager_runs(
    spec: RunSpec, ref_backend: Any, run_target: Callable[[RunSpec, str], Run]
) -> tuple[Run, Run]:
    """The reference and the target run of ``spec`` with ``torch.compile`` off.

    Run from the namespace as it was (call before the compiled runs are committed).
    ``run_target(spec, run_id)`` runs the target as the compiled run did (its executor, its
    what-if policy).
    """
    eager = eager_spec(spec)
    # what it logs goes nowhere, as what it prints: the compiled reference already wrote it
    with logging_setup.records_go_nowhere():
        ref = execute(eager, ref_backend, run_id=EAGER_RUN_IDS[0])
    target = run_target(eager, EAGER_RUN_IDS[1])
    return ref, target
