"""Static analysis of one Python source with the standard :mod:`ast` module.

Two passes: :func:`collect_context` resolves import aliases (``import torch as T``,
``from torch.cuda.amp import autocast``) and the names used as devices; :func:`analyze` then walks the
tree and matches every rule of :mod:`.rules`. Each match yields a :class:`~.findings.Finding` and, for
mechanically safe rewrites, a :class:`Fix` that :mod:`.migrate` applies with libcst. Fixes are keyed by
node type and character span, which ``ast`` and libcst agree on, so the scanner stays the single
judge of what is safe to rewrite.

Strings are only ever checked in *device positions* (``torch.device(...)``, ``.to(...)``,
``device=``, assignments to device-named variables, comparisons with ``.device.type``, device-choice
conditionals), so ``print("using cuda")`` or a comment never fires.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.scan.findings import Finding
from neuron_workbench.scan.rules import RULES

TARGETS = ("neuron", "tpu")

# "cuda" or "cuda:N" exactly; anything longer is prose, not a device.
_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")
_ANY_DEVICE = re.compile(r"(cuda|cpu|mps|xpu|neuron|tpu|xla|meta|hpu|npu)(:\d+)?")

_INT32_MAX = 2**31 - 1
_INT32_MIN = -(2**31)

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
ACCELERATOR_EQUIVALENTS: dict[str, str] = {
    "is_available": "is_available",
    "device_count": "device_count",
    "synchronize": "synchronize",
    "current_device": "current_device_index",
    "set_device": "set_device_index",
    "device": "device_index",
    "current_stream": "current_stream",
    "set_stream": "set_stream",
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
}

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

_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
_CUDA_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
_GRADSCALER = {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}
_CUDA_GRADSCALER = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
_CUDA_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")

_DEVICE_ARG0_CALLS = {
    "torch.device",
    "torch.set_default_device",
    "torch.get_device_module",
    "torch.distributed.device_mesh.init_device_mesh",
    "torch.distributed.init_device_mesh",
}
_DIST_INIT = {
    "torch.distributed.init_process_group",
    "torch.distributed.distributed_c10d.init_process_group",
}
_COMPILE_BACKENDS_CUDA = {"inductor", "cudagraphs", "tensorrt", "torch_tensorrt", "onnxrt"}
_EXT_LOAD = "torch.utils.cpp_extension.load"
_EXT_LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
_EXT_CUDA_EXTENSION = "torch.utils.cpp_extension.CUDAExtension"
_KERNEL_DECORATORS = {
    "triton.jit",
    "triton.autotune",
    "triton.heuristics",
    "numba.cuda.jit",
    "numba.cuda.reduce",
}
_KERNEL_CALLS = {
    "cupy.RawKernel",
    "cupy.RawModule",
    "cupy.ElementwiseKernel",
    "cupy.ReductionKernel",
    "pycuda.compiler.SourceModule",
    "numba.cuda.jit",
}
_FORK_CALLS = {
    "multiprocessing.set_start_method",
    "torch.multiprocessing.set_start_method",
    "multiprocessing.get_context",
    "torch.multiprocessing.get_context",
}

_SDPA = "torch.nn.functional.scaled_dot_product_attention"
# CUDA-only libraries (NW170): import root -> replacement.
_CUDA_LIBRARIES: dict[str, str] = {
    "apex": "torch.autocast + torch.amp.GradScaler for apex.amp, torch.optim.AdamW for "
    "FusedAdam, torch.nn.LayerNorm for FusedLayerNorm, the neuron process group for apex DDP",
    "bitsandbytes": "no Neuron equivalent is documented; use torch.optim.AdamW and unquantized "
    "weights",
    "flash_attn": f"{_SDPA} (routed to an NKI kernel under torch.compile, torchneuron.md §11 "
    "TORCH_NEURONX_ENABLE_NKI_SDPA)",
    "xformers": _SDPA,
    "triton": "an NKI kernel (torchneuron.md §10)",
    "cupy": "torch ops on the device (or numpy on CPU)",
    "cupyx": "torch ops on the device (or numpy on CPU)",
    "pycuda": "torch ops on the device, or an NKI kernel",
    "pynvml": "torch.neuron.memory_* or the neuron-ls / neuron-top tools",
    "transformer_engine": "torch.autocast with dtype=torch.bfloat16",
    "tensorrt": 'torch.compile(backend="neuron")',
    "torch_tensorrt": 'torch.compile(backend="neuron")',
    "numba.cuda": "torch ops on the device, or an NKI kernel",
    "cuda": "torch ops on the device (cuda-python is NVIDIA-only)",
    "nvidia.dali": "torch.utils.data.DataLoader",
}

# CUDA environment variables (NW130): name -> (neuron replacement, tpu replacement).
_CUDA_ENV: dict[str, tuple[str, str]] = {
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


@dataclass(frozen=True)
class Fix:
    """A mechanical rewrite of one node, located by node type and 0-based character span."""

    kind: str
    node: str  # libcst node class name: "SimpleString", "FormattedString", "Call", "Attribute"
    start: tuple[int, int]
    end: tuple[int, int]
    payload: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> tuple[str, tuple[int, int], tuple[int, int]]:
        """What libcst nodes are matched on."""
        return (self.node, self.start, self.end)

    def get(self, name: str) -> Any:
        """Return one payload value."""
        return dict(self.payload)[name]


@dataclass
class Context:
    """What the first pass learns about a module (or, for notebooks, all of its cells)."""

    imports: dict[str, str] = field(default_factory=dict)
    torch_aliases: set[str] = field(default_factory=set)
    device_names: set[str] = field(default_factory=set)

    def merge(self, other: Context) -> None:
        """Add another cell's context (notebook cells share one namespace)."""
        self.imports.update(other.imports)
        self.torch_aliases |= other.torch_aliases
        self.device_names |= other.device_names

    @property
    def torch_alias(self) -> str | None:
        """A name bound to the torch module by an import, preferring ``torch``."""
        if "torch" in self.torch_aliases:
            return "torch"
        return min(self.torch_aliases) if self.torch_aliases else None


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _qualname(node: ast.AST, imports: dict[str, str]) -> str | None:
    text = dotted(node)
    if text is None:
        return None
    head, _, rest = text.partition(".")
    if head in imports:
        base = imports[head]
    elif head == "torch":
        # A cell may use torch imported by an earlier cell or the kernel.
        base = "torch"
    else:
        return None
    return f"{base}.{rest}" if rest else base


def _kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _arg(call: ast.Call, index: int, name: str | None = None) -> ast.expr | None:
    if name is not None:
        found = _kwarg(call, name)
        if found is not None:
            return found
    if len(call.args) > index and not any(
        isinstance(a, ast.Starred) for a in call.args[: index + 1]
    ):
        return call.args[index]
    return None


def _str_value(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_device_ish(node: ast.AST, ctx: Context) -> bool:
    name = dotted(node)
    if name is None:
        return False
    if name in ctx.device_names:
        return True
    last = name.rsplit(".", 1)[-1].lower()
    if last == "type" and "." in name:
        # x.device.type, device.type
        return "device" in name.rsplit(".", 1)[0].rsplit(".", 1)[-1].lower()
    return "device" in last


def collect_context(tree: ast.AST) -> Context:
    """First pass: import aliases and the names that are used as devices.

    Parameters
    ----------
    tree : ast.AST
        A parsed module.

    Returns
    -------
    Context
        Imports (local name to qualified name), names bound to ``torch``, and dotted names passed
        where a device is expected (``.to(dev)``, ``device=dev``, ``torch.device(dev)``).
    """
    ctx = Context()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    ctx.imports[alias.asname] = alias.name
                    if alias.name == "torch":
                        ctx.torch_aliases.add(alias.asname)
                else:
                    root = alias.name.split(".", 1)[0]
                    ctx.imports[root] = root
                    if root == "torch":
                        ctx.torch_aliases.add("torch")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    ctx.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        candidates: list[ast.expr | None] = [_kwarg(node, "device"), _kwarg(node, "map_location")]
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "to" and node.args:
            candidates.append(node.args[0])
        if _qualname(func, ctx.imports) in _DEVICE_ARG0_CALLS:
            candidates.append(_arg(node, 0, "type"))
        for cand in candidates:
            name = dotted(cand) if cand is not None else None
            if name:
                ctx.device_names.add(name)
    return ctx


class _Lines:
    """Converts ``ast``'s UTF-8 byte columns to character columns."""

    def __init__(self, source: str) -> None:
        self._lines = [s.encode("utf-8") for s in re.split(r"\r\n|\r|\n", source)]

    def col(self, line: int, byte_col: int) -> int:
        if 0 < line <= len(self._lines):
            return len(self._lines[line - 1][:byte_col].decode("utf-8", "replace"))
        return byte_col


class _Scanner(ast.NodeVisitor):
    def __init__(self, source: str, path: str, target: str, ctx: Context, cell: int | None) -> None:
        self.lines = _Lines(source)
        self.source = source
        self.path = path
        self.target = target
        self.ctx = ctx
        self.cell = cell
        self.results: list[tuple[Finding, Fix | None]] = []
        self.claimed: set[int] = set()
        self.parents: dict[int, ast.AST] = {}

    # -- helpers -----------------------------------------------------------------------------
    def qn(self, node: ast.AST) -> str | None:
        return _qualname(node, self.ctx.imports)

    def start(self, node: Any) -> tuple[int, int]:
        return (node.lineno, self.lines.col(node.lineno, node.col_offset))

    def end(self, node: Any) -> tuple[int, int]:
        return (node.end_lineno, self.lines.col(node.end_lineno, node.end_col_offset))

    def fix(self, kind: str, node: ast.AST, cst_node: str, **payload: Any) -> Fix:
        return Fix(kind, cst_node, self.start(node), self.end(node), tuple(sorted(payload.items())))

    def report(
        self,
        rule_id: str,
        node: ast.AST,
        message: str,
        suggestion: str | None = None,
        fix: Fix | None = None,
        pos: tuple[int, int] | None = None,
    ) -> None:
        rule = RULES[rule_id]
        line, col = pos if pos is not None else self.start(node)
        finding = Finding(
            rule_id=rule.id,
            severity=rule.severity,
            message=message,
            suggestion=suggestion or rule.suggestion,
            source=rule.source,
            path=self.path,
            line=line,
            col=col + 1,
            cell=self.cell,
            fixable=fix is not None,
        )
        self.results.append((finding, fix))

    def is_outermost(self, node: ast.AST) -> bool:
        parent = self.parents.get(id(node))
        return not (isinstance(parent, ast.Attribute) and parent.value is node)

    # -- device strings ----------------------------------------------------------------------
    def check_device(self, expr: ast.AST | None, rule_id: str = "NW101", where: str = "") -> None:
        if expr is None:
            return
        if isinstance(expr, ast.IfExp):
            self.check_device(expr.body, rule_id, where)
            self.check_device(expr.orelse, rule_id, where)
            return
        if isinstance(expr, ast.BoolOp):
            for value in expr.values:
                self.check_device(value, rule_id, where)
            return
        if id(expr) in self.claimed:
            return
        value = _str_value(expr)
        if value is not None:
            m = _CUDA_DEVICE.fullmatch(value)
            if m:
                new = self.target + (m.group(1) or "")
                self.claimed.add(id(expr))
                self.report(
                    rule_id,
                    expr,
                    self._device_message(rule_id, f'"{value}"', where),
                    self._device_suggestion(rule_id, f'"{new}"'),
                    self.fix("string", expr, "SimpleString", new=new)
                    if self._single_literal(expr)
                    else None,
                )
            return
        if isinstance(expr, ast.JoinedStr) and expr.values:
            head = _str_value(expr.values[0])
            if head is not None and re.match(r"cuda(:|$)", head):
                self.claimed.add(id(expr))
                self.report(
                    rule_id,
                    expr,
                    self._device_message(rule_id, f'f"{head}..."', where),
                    self._device_suggestion(rule_id, f'f"{self.target}{head[4:]}..."'),
                    self.fix("fstring", expr, "FormattedString", new=self.target),
                )

    def _single_literal(self, node: ast.AST) -> bool:
        # "cu" "da" is one ast.Constant but two literals, which the rewrite does not handle.
        segment = ast.get_source_segment(self.source, node) or ""
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(segment).readline))
        except (tokenize.TokenError, SyntaxError):
            return False
        return sum(t.type == tokenize.STRING for t in tokens) == 1

    def _device_message(self, rule_id: str, text: str, where: str) -> str:
        if rule_id == "NW110":
            return f"autocast on device type {text}"
        if rule_id == "NW113":
            return f"GradScaler for device {text}"
        suffix = f" ({where})" if where else ""
        return f"device string {text} names a CUDA GPU{suffix}"

    def _device_suggestion(self, rule_id: str, new: str) -> str:
        if rule_id == "NW113":
            return f"use {new}; GradScaler support on {self.target} is not documented"
        return f"use {new}"

    # -- visitors ----------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        qn = self.qn(node.func)
        func = node.func
        handled_device_kw = False

        if isinstance(func, ast.Attribute) and qn is None:
            if func.attr == "cuda":
                self._cuda_method(node, func)
            elif func.attr == "to" and node.args:
                self.check_device(node.args[0], where="`.to()`")
            elif func.attr == "double" and not node.args and not node.keywords:
                self.report(
                    "NW180",
                    node,
                    "`.double()` makes float64, computed as float32 on neuron",
                    pos=self._attr_pos(func),
                )
            elif func.attr == "pin_memory" and not node.args:
                self.report(
                    "NW191", node, "`.pin_memory()` pins host memory", pos=self._attr_pos(func)
                )
            elif func.attr == "add_argument" and any(
                "device" in (_str_value(a) or "") for a in node.args
            ):
                self.check_device(_kwarg(node, "default"), where="argparse default")

        if qn in _DEVICE_ARG0_CALLS:
            self.check_device(_arg(node, 0, "type" if qn == "torch.device" else "device_type"))
        elif qn in _AUTOCAST or qn in _CUDA_AUTOCAST:
            self._autocast(node, qn)
            handled_device_kw = True
        elif qn in _GRADSCALER or qn in _CUDA_GRADSCALER:
            self._gradscaler(node, qn)
            handled_device_kw = True
        elif qn == "torch.Generator":
            self._generator(node)
            handled_device_kw = True
        elif qn == "torch.compile":
            self._compile(node)
        elif qn in _DIST_INIT:
            backend = _arg(node, 0, "backend")
            self._nccl(backend)
        elif qn in (_EXT_LOAD, _EXT_LOAD_INLINE, _EXT_CUDA_EXTENSION):
            self._extension(node, qn)
        elif qn in _KERNEL_CALLS:
            self.report("NW161", node, f"`{qn}` compiles a CUDA kernel")
        elif qn in _FORK_CALLS:
            if _str_value(_arg(node, 0, "method")) == "fork":
                self.report(
                    "NW192",
                    node,
                    f'`{qn}("fork")`: the Neuron runtime cannot be '
                    "re-initialised in a forked child",
                )
        elif qn in ("torch.view_as_complex", "torch.complex", "torch.polar"):
            self.report("NW182", node, f"`{qn}` creates a complex tensor")
        elif qn == "torch.iinfo" and self.qn(node.args[0] if node.args else node) in (
            "torch.int64",
            "torch.long",
        ):
            self.report("NW181", node, "int64 limits: int64 arithmetic on neuron may run as int32")

        for kw in node.keywords:
            if kw.arg in ("device", "map_location", "device_type") and not handled_device_kw:
                self.check_device(kw.value, where=f"`{kw.arg}=`")
            elif kw.arg == "pin_memory" and _is_true(kw.value):
                self.report(
                    "NW191", kw.value, "`pin_memory=True` pins host memory for the accelerator"
                )
            elif kw.arg == "backend" and qn not in _DIST_INIT and qn != "torch.compile":
                self._nccl(kw.value)
        self.generic_visit(node)

    def _attr_pos(self, func: ast.Attribute) -> tuple[int, int]:
        line, col = self.end(func)
        return (line, max(col - len(func.attr), 0))

    def _cuda_method(self, node: ast.Call, func: ast.Attribute) -> None:
        device_arg = _arg(node, 0, "device")
        other_kw = [k for k in node.keywords if k.arg not in ("device",)]
        fixable = (
            len(node.args) <= 1
            and not any(isinstance(a, ast.Starred) for a in node.args)
            and all(k.arg in ("non_blocking", "memory_format") for k in other_kw)
        )
        new = self.target
        if device_arg is not None:
            if isinstance(device_arg, ast.Constant) and device_arg.value is None:
                pass
            elif (
                isinstance(device_arg, ast.Constant)
                and isinstance(device_arg.value, int)
                and not isinstance(device_arg.value, bool)
            ):
                new = f"{self.target}:{device_arg.value}"
            else:
                fixable = False
        fix = self.fix("cuda_method", node, "Call", new=new) if fixable else None
        suggestion = (
            f'use `.to("{new}")`'
            if fixable
            else f'use `.to(...)` with a "{self.target}" device (the argument is not a '
            "literal index, so it is left for you)"
        )
        self.report(
            "NW102",
            node,
            "`.cuda()` moves to a CUDA GPU",
            suggestion,
            fix,
            pos=self._attr_pos(func),
        )

    def _autocast(self, node: ast.Call, qn: str) -> None:
        if qn in _CUDA_AUTOCAST:
            torch_name = self._torch_root(node.func)
            fixable = (
                torch_name is not None
                and not any(isinstance(a, ast.Starred) for a in node.args)
                and len(node.args) <= 3
            )
            fix = (
                self.fix(
                    "autocast_call", node, "Call", func=f"{torch_name}.autocast", device=self.target
                )
                if fixable
                else None
            )
            self.report(
                "NW110",
                node,
                f"`{qn}` is CUDA-only autocast",
                f'use `torch.autocast("{self.target}", ...)`',
                fix,
            )
            device_is_accel = True
        else:
            device = _arg(node, 0, "device_type")
            self.check_device(device, "NW110")
            value = _str_value(device)
            device_is_accel = (
                value is None
                or _CUDA_DEVICE.fullmatch(value) is not None
                or (value.split(":")[0] in TARGETS)
            )
        if not device_is_accel:
            return
        dtype = _kwarg(node, "dtype")
        if qn in _CUDA_AUTOCAST and dtype is None and len(node.args) >= 2:
            dtype = node.args[1]
        if dtype is None:
            self.report(
                "NW111",
                node,
                f"autocast without `dtype=` runs float16 on {self.target} (PrivateUse1 default)",
                "pass `dtype=torch.bfloat16` explicitly",
            )
        elif self.qn(dtype) in ("torch.float16", "torch.half"):
            self.report("NW112", dtype, "autocast to float16", RULES["NW112"].suggestion)

    def _torch_root(self, func: ast.AST) -> str | None:
        # For T.cuda.amp.X reuse T; for a name imported from torch.cuda.amp use an imported torch.
        node = func
        while isinstance(node, ast.Attribute):
            node = node.value
        if (
            isinstance(node, ast.Name)
            and node is not func
            and (self.ctx.imports.get(node.id, "torch" if node.id == "torch" else None) == "torch")
        ):
            return node.id
        return self.ctx.torch_alias

    def _gradscaler(self, node: ast.Call, qn: str) -> None:
        if qn in _CUDA_GRADSCALER:
            torch_name = self._torch_root(node.func)
            fix = (
                self.fix(
                    "gradscaler_call",
                    node,
                    "Call",
                    func=f"{torch_name}.amp.GradScaler",
                    device=self.target,
                )
                if torch_name is not None
                else None
            )
            self.report(
                "NW113",
                node,
                f"`{qn}` scales for CUDA",
                f'use `torch.amp.GradScaler("{self.target}")`; GradScaler support on '
                f"{self.target} is not documented",
                fix,
            )
            return
        device = _arg(node, 0, "device")
        if device is None and not any(isinstance(a, ast.Starred) for a in node.args):
            self.report(
                "NW113",
                node,
                "`GradScaler()` without a device defaults to cuda",
                f'use `GradScaler("{self.target}")`; GradScaler support on '
                f"{self.target} is not documented",
                self.fix("insert_device", node, "Call", device=self.target),
            )
        else:
            self.check_device(device, "NW113")

    def _generator(self, node: ast.Call) -> None:
        device = _arg(node, 0, "device")
        targets = [device.body, device.orelse] if isinstance(device, ast.IfExp) else [device]
        inner = [
            _arg(d, 0, "type")
            for d in targets
            if isinstance(d, ast.Call) and self.qn(d.func) == "torch.device"
        ]
        for d in targets + inner:
            value = _str_value(d)
            head = _str_value(d.values[0]) if isinstance(d, ast.JoinedStr) and d.values else None
            if (value and _CUDA_DEVICE.fullmatch(value)) or (head and head.startswith("cuda")):
                assert d is not None
                self.claimed.add(id(d))
                self.report("NW190", node, "`torch.Generator` on a CUDA device")
                return

    def _compile(self, node: ast.Call) -> None:
        mode = _str_value(_kwarg(node, "mode"))
        if mode and mode != "default":
            self.report(
                "NW150",
                _kwarg(node, "mode") or node,
                f'`torch.compile(mode="{mode}")`: neuron has only the default mode',
                "drop `mode=` (other modes warn and fall back to default on neuron; "
                "TorchTPU's handling is not in the notes)",
            )
        if _is_true(_kwarg(node, "dynamic")):
            self.report(
                "NW151",
                _kwarg(node, "dynamic") or node,
                "`torch.compile(dynamic=True)` is rejected by the neuron backend",
            )
        backend = _str_value(_kwarg(node, "backend"))
        if backend in _COMPILE_BACKENDS_CUDA:
            self.report(
                "NW152",
                _kwarg(node, "backend") or node,
                f'`torch.compile(backend="{backend}")` targets CUDA',
                f'use `backend="{self.target}"` or omit `backend=`',
            )

    def _nccl(self, backend: ast.AST | None) -> None:
        value = _str_value(backend)
        if backend is not None and value and "nccl" in value.lower():
            self.report(
                "NW140",
                backend,
                f'process-group backend "{value}" needs NCCL',
                'use `backend="neuron"`'
                if self.target == "neuron"
                else 'use `backend="tpu"` (TorchTPU registers "tpu" and "tpu_dist")',
            )

    def _extension(self, node: ast.Call, qn: str) -> None:
        name = qn.rsplit(".", 1)[-1]
        if qn == _EXT_CUDA_EXTENSION:
            self.report("NW160", node, "`CUDAExtension` builds CUDA code")
            return
        cuda = _is_true(_kwarg(node, "with_cuda")) or _kwarg(node, "extra_cuda_cflags") is not None
        if qn == _EXT_LOAD_INLINE:
            src = _arg(node, 2, "cuda_sources")
            cuda = cuda or (
                src is not None and not (isinstance(src, ast.Constant) and src.value is None)
            )
        else:
            sources = _arg(node, 1, "sources")
            items = sources.elts if isinstance(sources, (ast.List, ast.Tuple)) else [sources]
            cuda = cuda or any((_str_value(s) or "").endswith((".cu", ".cuh")) for s in items)
        if cuda:
            self.report("NW160", node, f"`{name}` compiles CUDA sources into an extension")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for deco in node.decorator_list:
            # Call decorators listed in _KERNEL_CALLS are reported by visit_Call.
            qn = self.qn(deco.func if isinstance(deco, ast.Call) else deco)
            if qn in _KERNEL_DECORATORS and not (
                isinstance(deco, ast.Call) and qn in _KERNEL_CALLS
            ):
                self.report("NW161", deco, f"`@{qn}` defines a GPU kernel (`{node.name}`)")
        args = node.args
        positional = args.posonlyargs + args.args
        for arg, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults):
            if "device" in arg.arg.lower():
                self.check_device(default, where=f"default of `{arg.arg}`")
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None and "device" in arg.arg.lower():
                self.check_device(default, where=f"default of `{arg.arg}`")
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if _is_device_ish(target, self.ctx):
                self.check_device(node.value, where=f"assigned to `{dotted(target)}`")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None and _is_device_ish(node.target, self.ctx):
            self.check_device(node.value, where=f"assigned to `{dotted(node.target)}`")
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values):
            key_text = _str_value(key)
            if key_text in _CUDA_ENV:
                self._env(key)
            elif key_text is not None and "device" in key_text.lower():
                self.check_device(value, where=f'"{key_text}" entry')
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        if any(_is_device_ish(o, self.ctx) for o in operands):
            for operand in operands:
                self.check_device(operand, where="comparison")
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        # `"cuda" if ... else "cpu"` chooses a device whatever it is assigned to.
        body, orelse = _str_value(node.body), _str_value(node.orelse)
        if (
            body is not None
            and orelse is not None
            and _ANY_DEVICE.fullmatch(body)
            and _ANY_DEVICE.fullmatch(orelse)
        ):
            self.check_device(node, where="device choice")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _str_value(node.slice) in _CUDA_ENV:
            self._env(node.slice)
        self.generic_visit(node)

    def _env_call(self, node: ast.Call) -> None:
        qn = self.qn(node.func)
        func = node.func
        is_env = qn in ("os.getenv", "os.putenv", "os.unsetenv") or (
            isinstance(func, ast.Attribute)
            and func.attr in ("get", "setdefault", "pop")
            and self.qn(func.value) == "os.environ"
        )
        if is_env and node.args and _str_value(node.args[0]) in _CUDA_ENV:
            self._env(node.args[0])

    def _env(self, node: ast.AST) -> None:
        if id(node) in self.claimed:
            return
        self.claimed.add(id(node))
        name = _str_value(node) or ""
        neuron, tpu = _CUDA_ENV[name]
        self.report(
            "NW130",
            node,
            f"`{name}` is ignored by the {self.target} runtime",
            neuron if self.target == "neuron" else tpu,
        )

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._torch_name(node)
        if node.attr == "is_cuda" and self.qn(node) is None:
            self.report(
                "NW106",
                node,
                "`.is_cuda` is False on the target",
                f"use `.is_{self.target}`",
                self.fix("rename_attr", node, "Attribute", name=f"is_{self.target}"),
                pos=self._attr_pos(node),
            )
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.ctx.imports:
            self._torch_name(node)

    def _torch_name(self, node: ast.Attribute | ast.Name) -> None:
        if not self.is_outermost(node):
            return
        qn = self.qn(node)
        if qn is None:
            return
        parent = self.parents.get(id(node))
        called = isinstance(parent, ast.Call) and parent.func is node
        if qn.startswith("torch.cuda."):
            self._torch_cuda(node, qn, called)
        elif qn.startswith("torch.backends.cudnn."):
            self.report("NW120", node, f"`{qn}` has no effect on {self.target}")
        elif qn.startswith("torch.backends.cuda."):
            self.report("NW121", node, f"`{qn}` has no effect on {self.target}")
        elif qn in ("torch.float64", "torch.double", "torch.DoubleTensor"):
            self.report("NW180", node, f"`{qn}` is computed as float32 on neuron")
        elif qn in (
            "torch.complex64",
            "torch.complex128",
            "torch.cfloat",
            "torch.cdouble",
            "torch.complex32",
            "torch.chalf",
        ):
            self.report("NW182", node, f"`{qn}`: complex dtypes are not supported on neuron")
        elif qn.startswith("torch.fft.") and called:
            self.report(
                "NW182",
                node,
                f"`{qn}` produces complex tensors; FFT has no Neuron "
                "kernel in the April-2026 source and runs on CPU (torchneuron.md §12)",
            )
        elif qn in ("torch.channels_last", "torch.channels_last_3d"):
            self.report("NW193", node, f"`{qn}` is rejected on neuron")
        elif qn == "torch.distributed.Backend.NCCL":
            self.report("NW140", node, "`Backend.NCCL` needs NCCL")

    def _torch_cuda(self, node: ast.Attribute | ast.Name, qn: str, called: bool) -> None:
        rest = qn.split(".")[2:]
        if rest[0] in _CUDA_SUBMODULES:
            if len(rest) < 2:
                return
            sub, name = rest[0], rest[1]
            if sub == "amp" and name in ("autocast", "GradScaler") and called:
                return  # reported by the call handlers
            if sub in ("memory", "random", "streams") and name in NEURON_EQUIVALENTS:
                self.report(
                    "NW103",
                    node,
                    f"`{qn}` needs CUDA",
                    f"use `torch.neuron.{name}`"
                    if self.target == "neuron"
                    else "no torch.accelerator equivalent is rewritten automatically",
                )
                return
            hint = _NO_EQUIVALENT_HINTS.get(
                sub if sub == "nvtx" else name, f"no torch.{self.target} equivalent is known"
            )
            self.report("NW104", node, f"`{qn}` has no equivalent on {self.target}", hint)
            return
        name = rest[0]
        if name in _CUDA_GRAPH_NAMES:
            self.report("NW105", node, f"`{qn}`: CUDA graphs have no {self.target} equivalent")
            return
        if name in NEURON_EQUIVALENTS:
            self._torch_cuda_equivalent(node, qn, name)
            return
        if name in _LEGACY_TENSOR_TYPES:
            hint = f'use `torch.tensor(..., device="{self.target}")` and a dtype'
        else:
            hint = _NO_EQUIVALENT_HINTS.get(
                name, f"`torch.{self.target}` has no `{name}`; remove or guard the call"
            )
        self.report("NW104", node, f"`{qn}` has no equivalent on {self.target}", hint)

    def _torch_cuda_equivalent(self, node: ast.Attribute | ast.Name, qn: str, name: str) -> None:
        # Rewritable only as <torch alias>.cuda.<name>; a name imported from torch.cuda would
        # need its import rewritten too, which is left to the user.
        rewritable = (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and self.qn(node.value.value) == "torch"
        )
        if self.target == "neuron":
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
            self.report("NW103", node, f"`{qn}` needs CUDA", suggestion)
            return
        new = f"torch.{module}.{new_name}"
        suggestion = f"use `{new}`" + (f"; note: {note}" if note else "")
        fix = (
            self.fix("torch_module", node, "Attribute", module=module, name=new_name)
            if rewritable
            else None
        )
        if fix is None:
            suggestion += " (imported by name: rewrite the import by hand)"
        self.report("NW103", node, f"`{qn}` needs CUDA", suggestion, fix)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
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
            self.report("NW107", node, f"`{what}` imports CUDA-specific names")
        for full in [module] + [f"{module}.{n}" for n in names]:
            lib = self._cuda_library(full)
            if lib:
                self.report(
                    "NW170",
                    node,
                    f"`{lib}` only works on NVIDIA GPUs",
                    f"replace it: {_CUDA_LIBRARIES[lib]}",
                )
                break

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            lib = self._cuda_library(alias.name)
            if lib:
                self.report(
                    "NW170",
                    node,
                    f"`{lib}` only works on NVIDIA GPUs",
                    f"replace it: {_CUDA_LIBRARIES[lib]}",
                )

    @staticmethod
    def _cuda_library(module: str) -> str | None:
        parts = module.split(".")
        for n in (2, 1):
            candidate = ".".join(parts[:n])
            if len(parts) >= n and candidate in _CUDA_LIBRARIES:
                return candidate
        return None

    # -- integers ----------------------------------------------------------------------------
    def _int_value(self, node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = self._int_value(node.operand)
            if inner is None:
                return None
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp):
            left, right = self._int_value(node.left), self._int_value(node.right)
            if left is None or right is None:
                return None
            try:
                if isinstance(node.op, ast.Pow) and 0 <= right <= 256:
                    return int(left**right)
                if isinstance(node.op, ast.LShift) and 0 <= right <= 256:
                    return left << right
                if isinstance(node.op, ast.Add):
                    return left + right
                if isinstance(node.op, ast.Sub):
                    return left - right
                if isinstance(node.op, ast.Mult):
                    return left * right
            except (OverflowError, ValueError):
                return None
        return None

    def _check_int(self, node: ast.AST) -> None:
        parent = self.parents.get(id(node))
        if parent is not None and self._int_value(parent) is not None:
            return  # the enclosing constant expression is checked instead
        value = self._int_value(node)
        if value is None or _INT32_MIN <= value <= _INT32_MAX:
            return
        # Only where the value meets torch: an argument of a torch call, or arithmetic with a
        # non-constant operand (which may be a tensor).
        in_arith = isinstance(parent, (ast.BinOp, ast.AugAssign))
        anc: ast.AST | None = parent
        in_torch_call = False
        while anc is not None:
            if isinstance(anc, ast.Call):
                qn = self.qn(anc.func) or ""
                if qn.startswith("torch.") and "seed" not in qn:
                    in_torch_call = True
                    break
            anc = self.parents.get(id(anc))
        if in_arith or in_torch_call:
            self.report("NW181", node, f"integer {value} does not fit in int32")

    def visit_Constant(self, node: ast.Constant) -> None:
        self._check_int(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self._check_int(node)
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        self._check_int(node)
        self.generic_visit(node)


def analyze(
    tree: ast.Module,
    source: str,
    path: str = "<cell>",
    *,
    target: str = "neuron",
    context: Context | None = None,
    cell: int | None = None,
) -> list[tuple[Finding, Fix | None]]:
    """Second pass: every rule over one parsed module.

    Parameters
    ----------
    tree : ast.Module
        The parsed source.
    source : str
        The source text (for character columns).
    path : str
        Shown in findings.
    target : {"neuron", "tpu"}
        The device the suggestions and fixes are written for.
    context : Context, optional
        The first pass's result; computed from ``tree`` when omitted (notebooks pass the context
        of all cells).
    cell : int, optional
        1-based code-cell index for notebooks.

    Returns
    -------
    list of (Finding, Fix or None)
        Sorted by location.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    scanner = _Scanner(source, path, target, context or collect_context(tree), cell)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            scanner.parents[id(child)] = parent
    # Environment lookups are calls whose string argument is not otherwise a device position.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            scanner._env_call(node)
    scanner.visit(tree)
    seen: set[tuple[str, int, int]] = set()
    unique = []
    for finding, fix in sorted(scanner.results, key=lambda r: r[0].sort_key()):
        key = (finding.rule_id, finding.line, finding.col)
        if key not in seen:
            seen.add(key)
            unique.append((finding, fix))
    return unique
