"""The ``torch.cuda`` API: equivalents (NW103), none known (NW104), graphs (NW105), imports (NW107).

On neuron, ``torch.cuda.X`` becomes ``torch.neuron.X`` for the functions ``torch.neuron`` has; on
tpu, the ``torch.accelerator`` equivalent where one exists. Everything else gets a hint.
"""

from __future__ import annotations

import ast

from neuron_workbench.cuda_semantics.accelerator_api import CUDA_TO_ACCELERATOR
from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.rule import (
    NEURON_ABOUT,
    NEURON_COMPILE,
    NEURON_LANDING,
    NEURON_NOTES,
    NEURON_SOURCE,
    Rule,
)

NW103 = Rule(
    "NW103",
    "torch-cuda-api",
    "info",
    "A `torch.cuda` function that has a direct equivalent on the target.",
    "`torch.neuron.<same name>` on neuron; the `torch.accelerator` equivalent on tpu.",
    f"{NEURON_NOTES} §4 (torch.neuron function list, from torch_neuronx/neuron.py); "
    f"{NEURON_SOURCE}; "
    f"{NEURON_NOTES} §2 (torch.accelerator needs no change; {NEURON_ABOUT})",
    fixable=True,
)
NW104 = Rule(
    "NW104",
    "torch-cuda-no-equivalent",
    "warning",
    "A `torch.cuda` API with no known equivalent on the target.",
    "Remove the call or guard it; see the finding for the nearest replacement.",
    f"{NEURON_NOTES} §4 ('Missing compared with torch.cuda'); {NEURON_SOURCE}",
)
NW105 = Rule(
    "NW105",
    "cuda-graphs",
    "error",
    "CUDA graphs have no equivalent on the target.",
    'Drop CUDA-graph capture; use `torch.compile(backend="neuron")` for whole-graph execution.',
    f"{NEURON_NOTES} §5 (no Inductor and no CUDA-graph equivalent); {NEURON_COMPILE}",
)
NW107 = Rule(
    "NW107",
    "torch-cuda-import",
    "info",
    "An import from `torch.cuda`; the imported names are CUDA-specific.",
    "Import the device-generic API instead (`torch.autocast`, `torch.amp.GradScaler`, "
    "`torch.neuron`), then delete this import.",
    f"{NEURON_NOTES} §4, §10; {NEURON_LANDING}",
)

# torch.neuron functions, from torchneuron.md §4 (torch_neuronx/neuron.py). Values are notes shown
# with the finding where the neuron function differs from CUDA's.
NEURON_EQUIVALENTS: dict[str, str] = {
    "is_initialized": "",
    "init": "",
    "is_available": "",
    "device_count": "it counts logical NeuronCores (torchneuron.md §2)",
    "current_device": "",
    "set_device": "",
    "device": "",
    "get_device_name": 'it returns "neuron:N"',
    "get_device_properties": "only the fields name and total_memory exist (torchneuron.md §9)",
    "get_amp_supported_dtype": "",
    "is_bf16_supported": "",
    "manual_seed": "random streams will not match CUDA's (torchneuron.md §7)",
    "manual_seed_all": "",
    "seed": "",
    "seed_all": "",
    "initial_seed": "",
    "get_rng_state": "",
    "set_rng_state": "",
    "Stream": "",
    "Event": "",
    "stream": "",
    "current_stream": "",
    "default_stream": "",
    "set_stream": "",
    "synchronize": "",
    "memory_stats": "the dict is nested, not flat like CUDA's (torchneuron.md §9)",
    "memory_allocated": "it includes cached blocks (torchneuron.md §9)",
    "max_memory_allocated": "",
    "memory_reserved": "it is currently always 0 (torchneuron.md §9)",
    "max_memory_reserved": "",
    "reset_peak_memory_stats": "",
    "reset_accumulated_memory_stats": "",
    "memory_summary": "",
    "empty_cache": "",
}

# torch.accelerator equivalents used for the tpu target (core PyTorch API; the notes do not list
# torch.tpu's functions, torchtpu.md §2).
ACCELERATOR_EQUIVALENTS = CUDA_TO_ACCELERATOR

# Hints for torch.cuda names with no equivalent (NW104).
_NO_EQUIVALENT_HINTS: dict[str, str] = {
    "get_device_capability": "there is no compute capability; drop capability checks "
    "(torchneuron.md §4 lists it as missing)",
    "mem_get_info": "use get_device_properties(i).total_memory and memory_allocated()",
    "reset_max_memory_allocated": "use reset_peak_memory_stats()",
    "max_memory_cached": "use max_memory_reserved()",
    "memory_cached": "use memory_reserved()",
    "get_rng_state_all": "loop over get_rng_state(i)",
    "set_rng_state_all": "loop over set_rng_state(state, i)",
    "set_per_process_memory_fraction": "no equivalent; remove it",
    "ipc_collect": "no equivalent; remove it",
    "get_arch_list": "no equivalent; remove it",
    "nvtx": "use torch.profiler.record_function(name)",
    "custom_fwd": 'use torch.amp.custom_fwd(device_type="neuron")',
    "custom_bwd": 'use torch.amp.custom_bwd(device_type="neuron")',
}
_LEGACY_TENSOR_TYPES = {
    f"{k}Tensor"
    for k in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
}
_CUDA_GRAPH_NAMES = {"CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle", "graphs"}
# torch.cuda submodules: a finding is reported on the name inside them, not on the submodule.
_CUDA_SUBMODULES = {
    "amp",
    "nvtx",
    "memory",
    "random",
    "streams",
    "comm",
    "nccl",
    "jiterator",
    "sparse",
    "tunable",
    "profiler",
    "_memory_viz",
}


def _torch_name(scan: Scan, node: ast.Attribute | ast.Name, qn: str, called: bool) -> None:
    if not qn.startswith("torch.cuda."):
        return
    rest = qn.split(".")[2:]
    if rest[0] in _CUDA_SUBMODULES:
        if len(rest) < 2:
            return
        sub, name = rest[0], rest[1]
        if sub == "amp" and name in ("autocast", "GradScaler") and called:
            return  # reported by the amp area's call hook
        if sub in ("memory", "random", "streams") and name in NEURON_EQUIVALENTS:
            scan.report(
                NW103,
                node,
                f"`{qn}` needs CUDA",
                f"use `torch.neuron.{name}`"
                if scan.target == "neuron"
                else "no torch.accelerator equivalent is rewritten automatically",
            )
            return
        hint = _NO_EQUIVALENT_HINTS.get(
            sub if sub == "nvtx" else name, f"no torch.{scan.target} equivalent is known"
        )
        scan.report(NW104, node, f"`{qn}` has no equivalent on {scan.target}", hint)
        return
    name = rest[0]
    if name in _CUDA_GRAPH_NAMES:
        scan.report(NW105, node, f"`{qn}`: CUDA graphs have no {scan.target} equivalent")
        return
    if name in NEURON_EQUIVALENTS:
        _equivalent(scan, node, qn, name)
        return
    if name in _LEGACY_TENSOR_TYPES:
        hint = f'use `torch.tensor(..., device="{scan.target}")` and a dtype'
    else:
        hint = _NO_EQUIVALENT_HINTS.get(
            name, f"`torch.{scan.target}` has no `{name}`; remove or guard the call"
        )
    scan.report(NW104, node, f"`{qn}` has no equivalent on {scan.target}", hint)


def _equivalent(scan: Scan, node: ast.Attribute | ast.Name, qn: str, name: str) -> None:
    # Rewritable only as <torch alias>.cuda.<name>; a name imported from torch.cuda would
    # need its import rewritten too, which is left to the user.
    rewritable = (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and scan.qn(node.value.value) == "torch"
    )
    if scan.target == "neuron":
        module, new_name, note = "neuron", name, NEURON_EQUIVALENTS[name]
    else:
        module, new_name, note = "accelerator", ACCELERATOR_EQUIVALENTS.get(name, ""), ""
    if not new_name:
        suggestion = (
            "no torch.accelerator equivalent; torch.tpu's functions are not listed "
            "in the notes (torchtpu.md §2)"
        )
        if name.startswith("manual_seed"):
            suggestion = "use `torch.manual_seed(seed)`, which seeds every device"
        scan.report(NW103, node, f"`{qn}` needs CUDA", suggestion)
        return
    new = f"torch.{module}.{new_name}"
    suggestion = f"use `{new}`" + (f"; note: {note}" if note else "")
    fix = (
        scan.fix("torch_module", node, "Attribute", module=module, name=new_name)
        if rewritable
        else None
    )
    if fix is None:
        through_alias = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        suggestion += (
            f" (through `{node.value.id}`, an alias of torch.cuda: rewrite its import by hand)"
            if through_alias and isinstance(node.value, ast.Name)
            else " (imported by name: rewrite the import by hand)"
        )
    scan.report(NW103, node, f"`{qn}` needs CUDA", suggestion, fix)


def _import_from(scan: Scan, node: ast.ImportFrom) -> None:
    module = node.module or ""
    if node.level:
        return
    names = [a.name for a in node.names]
    if (
        module == "torch.cuda"
        or module.startswith("torch.cuda.")
        or (module == "torch" and "cuda" in names)
    ):
        what = f"from {module} import {', '.join(names)}"
        scan.report(NW107, node, f"`{what}` imports CUDA-specific names")


def _import(scan: Scan, node: ast.Import) -> None:
    for alias in node.names:
        if alias.asname and (alias.name == "torch.cuda" or alias.name.startswith("torch.cuda.")):
            # `import torch.cuda as tc`: every tc.f() stays CUDA's after the rewrite
            what = f"import {alias.name} as {alias.asname}"
            scan.report(NW107, node, f"`{what}` binds a CUDA-specific module")


AREA = Area(
    "cuda_api",
    (NW103, NW104, NW105, NW107),
    {ast.ImportFrom: _import_from, ast.Import: _import},
    torch_name=_torch_name,
)
