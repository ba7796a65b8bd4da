"""Run artifacts: record a run on one machine, compare against it on another.

``save`` writes one zip file (``mimetype``, ``manifest.json``, ``tensors/<role>.safetensors``) that a
user can attach to a bug report; ``load`` reads it back without unpickling or executing anything and
raises only :class:`ArtifactError` (one line, naming the file and the problem) for bad input.
"""

from neuron_workbench.artifacts._format import (
    FORMAT,
    FORMAT_VERSION,
    MEDIA_TYPE,
    ROLE_RULE,
    ArtifactError,
    is_target_role,
    is_valid_role,
)
from neuron_workbench.artifacts.reader import RunArtifact, load, source_mismatch_warning
from neuron_workbench.artifacts.writer import save

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MEDIA_TYPE",
    "ROLE_RULE",
    "ArtifactError",
    "RunArtifact",
    "is_target_role",
    "is_valid_role",
    "load",
    "save",
    "source_mismatch_warning",
]
