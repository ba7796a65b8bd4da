"""Distributed training: the NCCL process-group backend (NW140), ``nn.DataParallel`` (NW141)."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.context import arg, str_value
from neuron_workbench.scan.rule import NEURON_LANDING, NEURON_NOTES, TPU_NOTES, Rule

NW140 = Rule(
    "NW140",
    "nccl-backend",
    "error",
    "The NCCL process-group backend does not exist on the target.",
    '`backend="neuron"` (TorchTPU registers "tpu" and "tpu_dist").',
    f'{NEURON_NOTES} §10 (dist.init_process_group(backend="neuron"); NCCL is not used; '
    f"{NEURON_LANDING}); "
    f"{TPU_NOTES} §2",
)

NW141 = Rule(
    "NW141",
    "data-parallel",
    "warning",
    "`nn.DataParallel` scatters and gathers with CUDA kernels; the target's parallelism is DDP.",
    "On one device call the module itself; across devices use DistributedDataParallel (or FSDP).",
    f"{NEURON_NOTES} §10 (Distributed: DDP, FSDP, DTensor TP/SP supported; DataParallel is not "
    f"among them; {NEURON_LANDING})",
)

_DATA_PARALLEL = {
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.data_parallel.data_parallel",
}

_DIST_INIT = {
    "torch.distributed.init_process_group",
    "torch.distributed.distributed_c10d.init_process_group",
}


def _call(scan: Scan, node: ast.Call) -> None:
    qn = scan.qn(node.func)
    if qn in _DATA_PARALLEL:
        scan.report(NW141, node, f"`{qn.rsplit('.', 1)[-1]}` runs through CUDA's scatter/gather")
        return
    if qn in _DIST_INIT:
        _nccl(scan, arg(node, 0, "backend"))
        return
    if qn == "torch.compile":
        return  # torch.compile's backend= is a compiler (the compile area)
    for kw in node.keywords:
        if kw.arg == "backend":
            _nccl(scan, kw.value)


def _nccl(scan: Scan, backend: ast.AST | None) -> None:
    value = str_value(backend)
    if backend is not None and value and "nccl" in value.lower():
        scan.report(
            NW140,
            backend,
            f'process-group backend "{value}" needs NCCL',
            'use `backend="neuron"`'
            if scan.target == "neuron"
            else 'use `backend="tpu"` (TorchTPU registers "tpu" and "tpu_dist")',
        )


def _torch_name(scan: Scan, node: ast.Attribute | ast.Name, qn: str, called: bool) -> None:
    if qn == "torch.distributed.Backend.NCCL":
        scan.report(NW140, node, "`Backend.NCCL` needs NCCL")


AREA = Area("distributed", (NW140, NW141), {ast.Call: _call}, torch_name=_torch_name)
