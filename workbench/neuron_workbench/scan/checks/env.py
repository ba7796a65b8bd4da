"""CUDA environment variables (NW130), in ``os.environ``, ``os.getenv`` and ``{...}`` entries."""

from __future__ import annotations

import ast

from neuron_workbench.scan.cells import SHELL_CALL
from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.context import str_value
from neuron_workbench.scan.rule import NEURON_ENV, NEURON_NOTES, TPU_NOTES, Rule

NW130 = Rule(
    "NW130",
    "cuda-env-var",
    "warning",
    "A CUDA environment variable, which the target runtime ignores.",
    "`NEURON_RT_VISIBLE_CORES` for device selection, `NEURON_LAUNCH_BLOCKING` for synchronous "
    "launches; set them before `import torch`.",
    f"{NEURON_NOTES} §11 ({NEURON_ENV}); {NEURON_NOTES} §3 (env vars must be set before import "
    f"torch); {TPU_NOTES} §7",
)

# CUDA environment variables (NW130): name -> (neuron replacement, tpu replacement).
CUDA_ENV: dict[str, tuple[str, str]] = {
    "CUDA_VISIBLE_DEVICES": (
        "NEURON_RT_VISIBLE_CORES (NeuronCore ids, not GPU ids; torchneuron.md §11)",
        "no TorchTPU equivalent is given in the notes (torchtpu.md §7 lists only topology "
        "variables such as TORCH_TPU_DEVICES_PER_HOST)",
    ),
    "CUDA_LAUNCH_BLOCKING": ("NEURON_LAUNCH_BLOCKING=1", "TPU_LAUNCH_BLOCKING=1"),
    "PYTORCH_CUDA_ALLOC_CONF": (
        "no documented equivalent for the Neuron caching allocator (torchneuron.md §11 lists the "
        "allocator variables as unknown)",
        "no equivalent is given in the notes",
    ),
    "CUDA_DEVICE_ORDER": ("no equivalent; remove it", "no equivalent; remove it"),
    "CUDA_MODULE_LOADING": ("no equivalent; remove it", "no equivalent; remove it"),
}


def _prepare(scan: Scan, tree: ast.Module) -> None:
    # Environment lookups are calls whose string argument is not otherwise a device position;
    # they are claimed before the walk so that no other check reads the name as a device.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            _env_call(scan, node)


def _env_call(scan: Scan, node: ast.Call) -> None:
    qn = scan.qn(node.func)
    func = node.func
    is_env = qn in ("os.getenv", "os.putenv", "os.unsetenv") or (
        isinstance(func, ast.Attribute)
        and func.attr in ("get", "setdefault", "pop")
        and scan.qn(func.value) == "os.environ"
    )
    if is_env and node.args and str_value(node.args[0]) in CUDA_ENV:
        _report(scan, node.args[0])


def _report(scan: Scan, node: ast.AST) -> None:
    if id(node) in scan.claimed:
        return
    scan.claimed.add(id(node))
    name = str_value(node) or ""
    neuron, tpu = CUDA_ENV[name]
    scan.report(
        NW130,
        node,
        f"`{name}` is ignored by the {scan.target} runtime",
        neuron if scan.target == "neuron" else tpu,
    )


def _dict(scan: Scan, node: ast.Dict) -> None:
    for key in node.keys:
        if str_value(key) in CUDA_ENV:
            assert key is not None
            _report(scan, key)


def _subscript(scan: Scan, node: ast.Subscript) -> None:
    if str_value(node.slice) in CUDA_ENV:
        _report(scan, node.slice)


NW131 = Rule(
    "NW131",
    "cuda-tool",
    "info",
    "A command running a CUDA tool (`!nvidia-smi`, `%%bash` with `nvcc`, "
    '`subprocess.run(["nvidia-smi"])`), which a host without NVIDIA GPUs does not have.',
    "On Trainium, `neuron-ls` lists the Neuron devices; a CUDA toolkit command has no Neuron "
    "counterpart in the notes.",
    f"{NEURON_NOTES} §10 (the troubleshooting page: run `neuron-ls`)",
)

#: CUDA's command-line tools: name -> what to use on each target instead.
CUDA_TOOLS: dict[str, tuple[str, str]] = {
    "nvidia-smi": (
        "use `neuron-ls` to list the Neuron devices (torchneuron.md §10)",
        "no TorchTPU equivalent is given in the notes",
    ),
    **{
        tool: ("no Neuron equivalent is given in the notes; remove it or guard it",) * 2
        for tool in (
            "nvcc",
            "nvprof",
            "nsys",
            "ncu",
            "cuda-gdb",
            "cuda-memcheck",
            "compute-sanitizer",
        )
    },
}


#: Calls that run a command: its first argument, a string or an argv list.
_RUNS_A_COMMAND = frozenset(
    {
        "os.system",
        "os.popen",
        "subprocess.run",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "subprocess.getoutput",
        "subprocess.getstatusoutput",
        "subprocess.Popen",
    }
)


def _command(scan: Scan, node: ast.Call) -> str | None:
    """The command ``node`` runs: a notebook's ``!line``, or a script's ``subprocess``/``os`` call."""
    if not node.args:
        return None
    if isinstance(node.func, ast.Name) and node.func.id == SHELL_CALL:
        # `!nvidia-smi` stands as `__nw_shell__('nvidia-smi')` in a notebook cell's Python text
        return str_value(node.args[0])
    if scan.qn(node.func) not in _RUNS_A_COMMAND:
        return None
    first = node.args[0]
    if isinstance(first, ast.List | ast.Tuple):
        return str_value(first.elts[0]) if first.elts else None
    return str_value(first)


def _call(scan: Scan, node: ast.Call) -> None:
    command = _command(scan, node) or ""
    for word in command.replace(";", " ").replace("&&", " ").replace("|", " ").split():
        tool = word.rsplit("/", 1)[-1]
        if tool in CUDA_TOOLS:
            neuron, tpu = CUDA_TOOLS[tool]
            scan.report(
                NW131,
                node,
                f"`{tool}` is a CUDA tool, absent on a {scan.target} host",
                neuron if scan.target == "neuron" else tpu,
            )
            return


AREA = Area(
    "env",
    (NW130, NW131),
    {ast.Dict: _dict, ast.Subscript: _subscript, ast.Call: _call},
    prepare=_prepare,
)
