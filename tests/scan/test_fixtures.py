"""The realistic CUDA scripts under fixtures/scripts: every `# expect:` finding, and nothing else."""

import io
import re
import tokenize
from collections import Counter
from pathlib import Path

import pytest

from neuron_workbench.scan import scan_path, scan_paths

SCRIPTS = sorted((Path(__file__).parent / "fixtures" / "scripts").glob("*.py"))
_EXPECT = re.compile(r"#\s*expect:\s*(NW\d{3}(?:\s*,\s*NW\d{3})*)")


def expected_findings(source):
    """Counter of (line, rule id) from `# expect: NW101, NW103` comments (not strings)."""
    found = Counter()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (m := _EXPECT.search(tok.string)):
            for rule in re.split(r"\s*,\s*", m.group(1)):
                found[(tok.start[0], rule)] += 1
    return found


def test_corpus_is_large_enough():
    names = {p.stem for p in SCRIPTS}
    assert len(SCRIPTS) >= 10
    # The required kinds of script.
    assert {
        "cnn_classifier",
        "lstm_language_model",
        "transformer_amp",
        "ddp_nccl",
        "compile_benchmark",
        "load_inline_kernel",
    } <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_expected_findings_exactly(script):
    expected = expected_findings(script.read_text())
    got = Counter((f.line, f.rule_id) for f in scan_path(script))
    assert got - expected == Counter(), "unexpected findings"
    assert expected - got == Counter(), "missing findings"


def test_lookalikes_report_nothing():
    assert scan_path(SCRIPTS[0].parent / "lookalikes.py") == []


def test_every_rule_is_exercised_by_the_corpus():
    from neuron_workbench.scan import RULES

    seen = {f.rule_id for f in scan_paths([SCRIPTS[0].parent])}
    assert seen == set(RULES)


def test_directory_scan_matches_per_file_scan():
    per_file = [f for p in SCRIPTS for f in scan_path(p)]
    assert scan_paths([SCRIPTS[0].parent]) == per_file
