"""Shared by the per-area check tests: each test module defines ``AREA`` and ``CASES``.

``CASES`` maps a rule id to (positive snippets, look-alike snippets), each snippet a whole
module; ``positive`` and ``lookalike`` test arguments are parametrized from it.
"""

import textwrap

import pytest

from neuron_workbench.scan import scan_source


def pytest_generate_tests(metafunc):
    cases = getattr(metafunc.module, "CASES", None)
    if cases is None:
        return
    if "positive" in metafunc.fixturenames:
        metafunc.parametrize(
            ("rule_id", "positive"), [(r, s) for r, (pos, _) in cases.items() for s in pos]
        )
    if "lookalike" in metafunc.fixturenames:
        metafunc.parametrize(
            ("rule_id", "lookalike"), [(r, s) for r, (_, neg) in cases.items() for s in neg]
        )


@pytest.fixture
def rule_ids():
    """``rule_ids(source)``: the rule ids found in a snippet scanned as ``snippet.py``."""

    def scan(source, target="neuron"):
        return [
            f.rule_id for f in scan_source(textwrap.dedent(source), "snippet.py", target=target)
        ]

    return scan
