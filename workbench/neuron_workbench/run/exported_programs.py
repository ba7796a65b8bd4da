"""Programs ``torch.export.export`` made, between processes (the target's worker and back).

torch's own pickling of an ``ExportedProgram`` fails (its graph module's tracer cannot be made
again), so a notebook holding one could not send a single ``%%neuron`` cell reading it to the
target's worker. A program travels as the archive ``torch.export.save`` writes, its weights on the
host, with the device they were on: loaded, its tensors carry it as a tensor sent back from a
device does, and a move of the program (:func:`program_moved`) takes them there again.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.passes import move_to_device_pass

from neuron_workbench.quiet import warnings_ignored
from neuron_workbench.run.device_origin import ORIGIN_ATTR, origin_of

__all__ = [
    "EXPORTED_PROGRAM",
    "exported_program_again",
    "program_moved",
    "program_tensors",
    "reduce_exported_program",
]

EXPORTED_PROGRAM = ExportedProgram


def program_tensors(program: ExportedProgram) -> list[torch.Tensor]:
    """The tensors a program holds: its parameters, buffers and constants."""
    tensors = [t for t in program.state_dict.values() if isinstance(t, torch.Tensor)]
    tensors += [t for t in program.constants.values() if isinstance(t, torch.Tensor)]
    return tensors


def program_moved(program: ExportedProgram, device: torch.device) -> ExportedProgram:
    """``program`` with its tensors, and the devices its graph names, on ``device``.

    A new program (``torch.export.passes.move_to_device_pass``); ``program`` where none moves.
    """
    if all(tensor.device == device for tensor in program_tensors(program)):
        return program
    with warnings_ignored():
        return move_to_device_pass(program, device)


def reduce_exported_program(program: ExportedProgram) -> tuple[Any, tuple[Any, ...]]:
    """The pickle reduction of an exported program: ``(rebuild, arguments)``.

    Its archive, written with its tensors on the host, and the device they were on (None: the
    host; the first met, a program's tensors being on one device).
    """
    origin = next(filter(None, map(origin_of, program_tensors(program))), None)
    archive = io.BytesIO()
    with warnings_ignored():
        torch.export.save(program_moved(program, torch.device("cpu")), archive)
    return exported_program_again, (archive.getvalue(), origin)


def exported_program_again(archive: bytes, origin: str | None) -> ExportedProgram:
    """The sender's program, loaded here; its tensors marked as sent back from ``origin``."""
    with warnings_ignored():
        program = torch.export.load(io.BytesIO(archive))
    if origin is not None:
        for tensor in program_tensors(program):
            vars(tensor)[ORIGIN_ATTR] = origin
    return program
