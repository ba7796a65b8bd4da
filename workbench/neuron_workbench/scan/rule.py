"""What a rule is: the :class:`Rule` record, its severities, and the vendor pages rules cite.

Each rule is declared next to its check, in the :mod:`.checks` module of its rule area, and
:mod:`.rules` collects them into the registry. Rule ids are stable: tools and ``# noqa``-style
filters may key on them, so a retired rule keeps its id reserved. Every rule names the vendor fact
it rests on (``source``): a section of the shared notes in ``shared/notes/`` plus the vendor page
those notes cite. Where the notes say a behaviour is unknown, the rule's text says so instead of
guessing.

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
NEURON_NOTES = "shared/notes/torchneuron.md"
TPU_NOTES = "shared/notes/torchtpu.md"
NEURON_LANDING = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html"
NEURON_ABOUT = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/about-pytorch-neuron.html"
)
NEURON_COMPILE = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html"
NEURON_ENV = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/reference/env-vars.html"
NEURON_SOURCE = (
    "https://github.com/parmoham-aws/test-repo-parmoham (public copy of torch-neuronx, 2026-04)"
)
TPU_DOCS = "https://torchtpu.readthedocs.io/"


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
