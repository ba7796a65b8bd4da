"""The rule registry: one :class:`Rule` per kind of CUDA-only code the scanner reports.

Rule ids are stable: tools and ``# noqa``-style filters may key on them, so a retired rule keeps its
id reserved. Every rule names the vendor fact it rests on (``source``): a section of the shared notes
in ``shared/notes/`` plus the vendor page those notes cite. Where the notes say a behaviour is unknown,
the rule's text says so instead of guessing.

Severities:

- ``error``: will not run on the target as written (CUDA kernels, NCCL, CUDA-only libraries, ...);
- ``warning``: runs, but differs from CUDA or needs a manual decision (fp64, autocast fp16, compile
  options, ...);
- ``info``: a mechanical rename, or a setting that is silently irrelevant on the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["info", "warning", "error"]

SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "error": 2}

# Vendor pages cited by the notes; kept in one place so that a moved page is fixed once.
_N = "shared/notes/torchneuron.md"
_T = "shared/notes/torchtpu.md"
_N_LANDING = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html"
_N_ABOUT = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/about-pytorch-neuron.html"
_N_COMPILE = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html"
_N_ENV = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/reference/env-vars.html"
_N_SRC = (
    "https://github.com/parmoham-aws/test-repo-parmoham (public copy of torch-neuronx, 2026-04)"
)
_N_TROUBLE = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/troubleshooting.html"
_T_DOCS = "https://torchtpu.readthedocs.io/"


@dataclass(frozen=True)
class Rule:
    """One kind of finding.

    Attributes
    ----------
    id : str
        Stable identifier such as ``"NW101"``.
    name : str
        Short kebab-case name, e.g. ``"device-string"``.
    severity : {"info", "warning", "error"}
        How much the finding matters on the target (see the module docstring).
    message : str
        What the rule detects, in one sentence (findings carry a more specific message).
    suggestion : str
        The change to make, in general terms (findings carry a specific one).
    source : str
        The vendor fact the rule rests on: a notes section and the vendor page it cites.
    fixable : bool
        Whether ``migrate`` can rewrite matches mechanically. Individual findings may still be
        unfixable (e.g. a ``torch.cuda`` function imported by name).
    """

    id: str
    name: str
    severity: Severity
    message: str
    suggestion: str
    source: str
    fixable: bool = False


_RULE_LIST: tuple[Rule, ...] = (
    Rule(
        "NW101",
        "device-string",
        "info",
        'A "cuda" device string where a device is expected.',
        'Use the target device string ("cuda:N" becomes "neuron:N" or "tpu:N").',
        f"{_N} §10 (`.to('cuda')` becomes `.to('neuron')`); {_N_LANDING}; {_T} §2",
        fixable=True,
    ),
    Rule(
        "NW102",
        "cuda-method",
        "info",
        "`.cuda()` moves a tensor or module to a CUDA GPU.",
        '`.to("neuron")` (or `.to("tpu")`).',
        f"{_N} §10; {_N_LANDING}",
        fixable=True,
    ),
    Rule(
        "NW103",
        "torch-cuda-api",
        "info",
        "A `torch.cuda` function that has a direct equivalent on the target.",
        "`torch.neuron.<same name>` on neuron; the `torch.accelerator` equivalent on tpu.",
        f"{_N} §4 (torch.neuron function list, from torch_neuronx/neuron.py); {_N_SRC}; "
        f"{_N} §2 (torch.accelerator needs no change; {_N_ABOUT})",
        fixable=True,
    ),
    Rule(
        "NW104",
        "torch-cuda-no-equivalent",
        "warning",
        "A `torch.cuda` API with no known equivalent on the target.",
        "Remove the call or guard it; see the finding for the nearest replacement.",
        f"{_N} §4 ('Missing compared with torch.cuda'); {_N_SRC}",
    ),
    Rule(
        "NW105",
        "cuda-graphs",
        "error",
        "CUDA graphs have no equivalent on the target.",
        'Drop CUDA-graph capture; use `torch.compile(backend="neuron")` for whole-graph execution.',
        f"{_N} §5 (no Inductor and no CUDA-graph equivalent); {_N_COMPILE}",
    ),
    Rule(
        "NW106",
        "is-cuda",
        "info",
        "`.is_cuda` is False for every tensor on the target.",
        "`.is_neuron` (or `.is_tpu`), generated for the PrivateUse1 backend.",
        f"{_N} §2 (generate_methods_for_privateuse1_backend adds tensor.is_neuron); {_N_SRC}; {_T} §2",
        fixable=True,
    ),
    Rule(
        "NW107",
        "torch-cuda-import",
        "info",
        "An import from `torch.cuda`; the imported names are CUDA-specific.",
        "Import the device-generic API instead (`torch.autocast`, `torch.amp.GradScaler`, "
        "`torch.neuron`), then delete this import.",
        f"{_N} §4, §10; {_N_LANDING}",
    ),
    Rule(
        "NW110",
        "autocast-device",
        "info",
        "Autocast on the CUDA device type.",
        '`torch.autocast("neuron", ...)`; the dtype is kept as written.',
        f'{_N} §10 (`torch.autocast(device_type="neuron")`); {_N_LANDING}',
        fixable=True,
    ),
    Rule(
        "NW111",
        "autocast-fp16-default",
        "warning",
        "Autocast without `dtype=` uses float16 on the target (PrivateUse1's default).",
        "Pass `dtype=torch.bfloat16` explicitly, as the Neuron docs advise.",
        f"{_N} §7 (autocast: PyTorch's PrivateUse1 default is at::kHalf; TorchNeuron does not call "
        f"set_autocast_dtype; {_N_SRC}); {_N} §10 ({_N_LANDING}); {_T} §5",
    ),
    Rule(
        "NW112",
        "autocast-fp16",
        "info",
        "Autocast to float16; bfloat16 is the recommended mixed-precision type on the target.",
        "Consider `dtype=torch.bfloat16` (then a GradScaler is usually unnecessary).",
        f"{_N} §10 (give dtype=torch.bfloat16; {_N_LANDING}); {_T} §5 (float16 'not yet supported' "
        f"in places; {_T_DOCS})",
    ),
    Rule(
        "NW113",
        "gradscaler-device",
        "info",
        "A GradScaler for CUDA (`torch.cuda.amp.GradScaler`, or `GradScaler()` defaulting to cuda).",
        '`torch.amp.GradScaler("neuron")`. Whether TorchNeuron supports GradScaler is not documented.',
        f"{_N} §7 (GradScaler: not mentioned in any reviewed doc page; unknown)",
        fixable=True,
    ),
    Rule(
        "NW120",
        "cudnn-flags",
        "info",
        "`torch.backends.cudnn` settings have no effect on the target.",
        "Delete the setting; for determinism use `torch.use_deterministic_algorithms(True)`.",
        f"{_N} §10 (no equivalent of torch.backends.cudnn; {_N_SRC}); {_N} §6.6 "
        f"(use_deterministic_algorithms disables fusion)",
    ),
    Rule(
        "NW121",
        "cuda-backend-flags",
        "info",
        "`torch.backends.cuda` settings (TF32, SDPA kernel choice) have no effect on the target.",
        "Delete the setting. Neuron compiles fp32 matmuls without auto-cast; on TPU use "
        "`torch.set_float32_matmul_precision` or `torch.tpu.precision`.",
        f"{_N} §10 (no equivalent of cuda.matmul.allow_tf32); {_N} §7 (--auto-cast=none; {_N_SRC}); "
        f"{_T} §5",
    ),
    Rule(
        "NW130",
        "cuda-env-var",
        "warning",
        "A CUDA environment variable, which the target runtime ignores.",
        "`NEURON_RT_VISIBLE_CORES` for device selection, `NEURON_LAUNCH_BLOCKING` for synchronous "
        "launches; set them before `import torch`.",
        f"{_N} §11 ({_N_ENV}); {_N} §3 (env vars must be set before import torch); {_T} §7",
    ),
    Rule(
        "NW140",
        "nccl-backend",
        "error",
        "The NCCL process-group backend does not exist on the target.",
        '`backend="neuron"` (TorchTPU registers "tpu" and "tpu_dist").',
        f'{_N} §10 (dist.init_process_group(backend="neuron"); NCCL is not used; {_N_LANDING}); '
        f"{_T} §2",
    ),
    Rule(
        "NW150",
        "compile-mode",
        "warning",
        "A CUDA-only `torch.compile` mode (autotune / CUDA graphs).",
        "Drop `mode=`; only the default mode exists on neuron (others warn and fall back).",
        f"{_N} §5 ({_N_COMPILE}: mode only default)",
    ),
    Rule(
        "NW151",
        "compile-dynamic",
        "error",
        "`torch.compile(dynamic=True)` is rejected by the neuron backend.",
        "Drop `dynamic=True`; each new input shape compiles once (pad or bucket shapes).",
        f"{_N} §5 ({_N_COMPILE}: dynamic=True is rejected); {_T} §2 (dynamic defaults to False)",
    ),
    Rule(
        "NW152",
        "compile-backend",
        "error",
        "A `torch.compile` backend that targets CUDA (Inductor/Triton, CUDA graphs).",
        '`backend="neuron"` (or omit it: neuron is auto-selected for neuron tensors); `"tpu"` on TPU.',
        f'{_N} §5 (backend="neuron"; no Inductor; {_N_COMPILE}); {_T} §2 (backend="inductor" '
        f"with TPU inputs raises)",
    ),
    Rule(
        "NW160",
        "cuda-extension",
        "error",
        "A C++/CUDA extension built from CUDA sources cannot run on the target.",
        "Port the kernel to NKI (`@nki.jit` + `torch_neuronx.nki_op`), or express it in PyTorch ops.",
        f"{_N} §10 (custom CUDA/Triton kernels become NKI kernels; {_N_LANDING})",
    ),
    Rule(
        "NW161",
        "gpu-kernel",
        "error",
        "A GPU kernel written with Triton, Numba CUDA, CuPy or PyCUDA cannot run on the target.",
        "Port the kernel to NKI (`@nki.jit` + `torch_neuronx.nki_op`), or express it in PyTorch ops.",
        f"{_N} §10 (custom CUDA/Triton kernels become NKI kernels; {_N_LANDING})",
    ),
    Rule(
        "NW170",
        "cuda-only-library",
        "error",
        "A library that only works on NVIDIA GPUs.",
        "Replace it with the PyTorch equivalent named in the finding.",
        f"{_N} §10 (custom CUDA kernels must be ported; {_N_LANDING}); {_N} §5 (no Inductor/Triton)",
    ),
    Rule(
        "NW180",
        "float64",
        "warning",
        "float64 is computed as float32 on neuron (no fp64 hardware).",
        "Use float32 on the device, or keep the fp64 part on CPU.",
        f"{_N} §7 (64-bit dtypes: eager ops cast float64 to float32; {_N_SRC})",
    ),
    Rule(
        "NW181",
        "int32-overflow",
        "warning",
        "An integer outside the int32 range; int64 arithmetic on neuron may run as int32.",
        "Keep such values on CPU, or check that the computation stays inside int32.",
        f"{_N} §7 (dtype_autocast: int64 to int32; 'int64 arithmetic may be int32' is an inference; "
        f"{_N_SRC})",
    ),
    Rule(
        "NW182",
        "complex-dtype",
        "warning",
        "Complex dtypes are not supported on neuron (decomposed since 2.33) nor everywhere on TPU.",
        "Work on real and imaginary parts (`torch.view_as_real`) or keep this on CPU.",
        f"{_N} §7 (complex: xfail 'Complex data types are not supported on Neuron'; "
        f"TORCH_NEURONX_COMPLEX_DECOMPOSE, {_N_ENV}); {_T} §5",
    ),
    Rule(
        "NW190",
        "cuda-generator",
        "error",
        "`torch.Generator` on a CUDA device; per-device generators are not guaranteed on the target.",
        "Use a CPU `torch.Generator()` (or `torch.manual_seed`); do not expect CUDA's random streams.",
        f'{_N} §7 (RNG: torch.Generator(device="neuron") was unavailable in a beta, [3P]); '
        f"{_N} §10 (RNG parity not guaranteed)",
    ),
    Rule(
        "NW191",
        "pin-memory",
        "info",
        "Pinned host memory behaves differently on the target.",
        "Usually harmless; drop `pin_memory=True` if host-to-device copies misbehave.",
        f"{_N} §10 (pin_memory: isPinnedPtr always true, PrivateUse1 host allocator; {_N_SRC})",
    ),
    Rule(
        "NW192",
        "fork-start-method",
        "warning",
        "The Neuron runtime cannot be re-initialised in a forked child.",
        'Use the "spawn" start method.',
        f"{_N} §2 (fork safety: 'use the spawn start method'; {_N_SRC})",
    ),
    Rule(
        "NW193",
        "channels-last",
        "error",
        "`channels_last` memory format is rejected on neuron.",
        "Drop `memory_format=torch.channels_last` (use contiguous tensors).",
        f"{_N} §10 ('Neuron tensors only support contiguous or preserve memory format'; {_N_SRC})",
    ),
)

#: Every rule by id, in id order.
RULES: dict[str, Rule] = {rule.id: rule for rule in _RULE_LIST}


def get_rule(rule_id: str) -> Rule:
    """Return the rule with this id.

    Parameters
    ----------
    rule_id : str
        A rule id such as ``"NW101"``.

    Returns
    -------
    Rule
        The registered rule.

    Raises
    ------
    KeyError
        If no rule has this id.
    """
    return RULES[rule_id]


def rules_markdown() -> str:
    """The rule table as Markdown (``README.md`` embeds it; a test keeps the two in sync).

    Returns
    -------
    str
        One row per rule: id, name, severity, auto-fix, what it detects.
    """
    rows = ["| Id | Name | Severity | Auto-fix | Detects |", "|---|---|---|---|---|"]
    for rule in RULES.values():
        fix = "yes" if rule.fixable else ""
        rows.append(f"| {rule.id} | `{rule.name}` | {rule.severity} | {fix} | {rule.message} |")
    return "\n".join(rows)
