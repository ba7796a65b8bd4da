"""The report's JSON schema version, and the reader of earlier versions' data.

Torch-free, so that renderers of report data (HTML, views) can read any version where only the
JSON is at hand. The schema itself is ``report.schema.json`` next to this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.report.display import run_label
from neuron_workbench.version import __version__

__all__ = ["READABLE_SCHEMA_VERSIONS", "SCHEMA_VERSION", "read_report"]

#: ``schema_version`` of ``Report.to_dict()`` (``report.schema.json``). Version 2 names the op
#: profile's step count ``steps`` and its per-step times ``step_times_s`` (``iterations`` and
#: ``iteration_times_s`` in version 1): one name for ``--steps``; and each run carries its display
#: ``label`` (see :mod:`neuron_workbench.report.display`). The verdict ``UNCOMPARED`` and the output
#: status ``not-compared`` were added to version 2 without a new version: every earlier document is
#: still valid, and renderers show a verdict or status they do not know in a neutral colour.
#: Version 3 adds ``budget`` (each floating output's noise floor and error ratio R; null when not
#: measured) and the ``judge`` option; earlier documents read as measuring no budget.
SCHEMA_VERSION = 3
#: Versions :func:`read_report` reads.
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
_PROFILE_KEYS_V1 = {"iterations": "steps", "iteration_times_s": "step_times_s"}


def read_report(data: Mapping[str, Any]) -> dict[str, Any]:
    """A report's data in the current schema, from any version in :data:`READABLE_SCHEMA_VERSIONS`.

    Parameters
    ----------
    data : mapping
        :meth:`Report.to_dict` data as written by this or an earlier version (e.g. read from a
        ``run --json`` document or a notebook's report output). Data without ``schema_version``
        (a partial dict built by hand) is taken as current.

    Returns
    -------
    dict
        A new dict with ``schema_version`` equal to :data:`SCHEMA_VERSION` (the input is not
        changed).

    Raises
    ------
    WorkbenchUsageError
        For a version this package does not read (newer than it).
    """
    out = dict(data)
    version = out.get("schema_version", SCHEMA_VERSION)
    if version not in READABLE_SCHEMA_VERSIONS:
        raise WorkbenchUsageError(
            f"report schema_version {version!r} is not one this neuron-workbench {__version__} "
            f"reads ({', '.join(map(str, READABLE_SCHEMA_VERSIONS))}); upgrade neuron-workbench"
        )
    if version == 1:
        for role in ("ref", "target"):
            run = out.get(role)
            if not isinstance(run, dict):
                continue
            run = {**run, "label": run_label(run)}
            if isinstance(run.get("profile"), dict):
                profile = {_PROFILE_KEYS_V1.get(k, k): v for k, v in run["profile"].items()}
                run["profile"] = profile
            out[role] = run
    if version < 3:
        out.setdefault("budget", None)
    out["schema_version"] = SCHEMA_VERSION
    return out
