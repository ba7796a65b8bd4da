"""Device profiles as data: native op coverage, fallback policy and numerics policy.

A profile is built from a coverage file (one ATen base op name per line, ``#`` comments; the format
of ``shared/coverage/README.md``). The packaged files are copies of the project's coverage lists,
headers included, so their provenance travels with them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Profile", "load_coverage", "load_profile", "packaged_coverage_path", "DEVICES"]

DEVICES = ("neuron", "tpu")

_COVERAGE_DIR = Path(__file__).resolve().parent / "coverage"
_PACKAGED = {"neuron": "neuron-2026-04.txt", "tpu": "tpu-0.2.0.txt"}

# One-line provenance for the packaged files (the full text is in each file's header).
_PACKAGED_PROVENANCE = {
    "neuron-2026-04": "TorchNeuron native ops, static extraction of the April-2026 torch-neuronx "
    "source (public copy parmoham-aws/test-repo-parmoham @ 98154b86)",
    "tpu-0.2.0": "TorchTPU native ops, extracted from the torch-tpu 0.2.0 wheel's PrivateUse1 "
    "registrations (sha256 52bacb56...)",
}


@dataclass(frozen=True)
class Profile:
    """What an emulated device supports natively and how it computes.

    Parameters
    ----------
    device
        ``"neuron"`` or ``"tpu"``.
    name
        Profile name: the coverage file's stem, e.g. ``"neuron-2026-04"``.
    provenance
        One line saying where the coverage list came from.
    native_ops
        ATen base op names (no ``aten::`` prefix, no overload) with a device kernel.
    path
        The coverage file that was read.
    """

    device: str
    name: str
    provenance: str
    native_ops: frozenset[str]
    path: str
    header: tuple[str, ...] = field(default=(), repr=False)

    @property
    def fallback_default(self) -> bool:
        """Whether unsupported ops run on CPU by default (TorchNeuron yes, TorchTPU no)."""
        return self.device == "neuron"


def packaged_coverage_path(device: str) -> Path:
    """Path of the coverage file shipped for ``device``.

    Parameters
    ----------
    device
        ``"neuron"`` or ``"tpu"``.

    Returns
    -------
    Path
        The packaged ``.txt`` file.
    """
    return _COVERAGE_DIR / _PACKAGED[device]


def load_coverage(path: str | os.PathLike) -> tuple[frozenset[str], tuple[str, ...]]:
    """Read a coverage file.

    Parameters
    ----------
    path
        A text file, one ATen base op name per line; ``#`` lines are comments. Entries written as
        ``aten::name.overload`` (as the dispatcher lists them) are reduced to the base name.

    Returns
    -------
    tuple
        ``(op names, header comment lines)``.
    """
    text = Path(path).read_text(encoding="utf-8")
    names: set[str] = set()
    header: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            header.append(line.lstrip("#").strip())
            continue
        if "::" in line:
            ns, line = line.split("::", 1)
            if ns != "aten":
                continue
        names.add(line.split(".", 1)[0])
    return frozenset(names), tuple(header)


def _provenance_from_header(header: tuple[str, ...], count: int) -> str:
    for line in header:
        low = line.lower()
        if low.startswith("provenance:"):
            return f"{line.split(':', 1)[1].strip()} ({count} ops)"
    if header:
        return f"{header[0]} ({count} ops)"
    return f"user coverage file ({count} ops)"


def load_profile(device: str, coverage: str | os.PathLike | None = None) -> Profile:
    """Build the profile for ``device`` from the packaged list or a user's coverage file.

    Parameters
    ----------
    device
        ``"neuron"`` or ``"tpu"``.
    coverage
        Optional path to a coverage file, e.g. one written by ``neuron-workbench coverage export``
        on a machine with the real backend. Its stem becomes the profile name.

    Returns
    -------
    Profile
        The profile.
    """
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)}")
    path = Path(coverage) if coverage is not None else packaged_coverage_path(device)
    ops, header = load_coverage(path)
    name = path.stem
    if coverage is None and name in _PACKAGED_PROVENANCE:
        provenance = f"{_PACKAGED_PROVENANCE[name]} ({len(ops)} ops)"
    else:
        provenance = _provenance_from_header(header, len(ops))
    return Profile(
        device=device,
        name=name,
        provenance=provenance,
        native_ops=ops,
        path=str(path),
        header=header,
    )
