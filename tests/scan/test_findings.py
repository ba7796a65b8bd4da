"""Result objects: ScanReport rendering, JSON, Migration text, the README rule table."""

import json
from pathlib import Path

from neuron_workbench.scan import (
    RULES,
    ScanReport,
    migrate_source,
    scan_cell,
    scan_source,
    summarize,
)
from neuron_workbench.scan.rules import rules_markdown

SRC = (
    "import torch\nimport torch.distributed as dist\nx = t.cuda()\n"
    'dist.init_process_group("nccl")\ny = torch.zeros(1, dtype=torch.float64)\n'
)


def test_report_text_is_deterministic_and_sorted():
    report = ScanReport(tuple(scan_source(SRC, "s.py")))
    text = report.to_text()
    assert text == ScanReport(tuple(scan_source(SRC, "s.py"))).to_text()
    lines = [line for line in text.splitlines() if not line.startswith("    ")]
    assert [line.split(": ")[1].split()[0] for line in lines[:-1]] == ["NW102", "NW140", "NW180"]
    assert lines[-1] == "3 findings: 1 error, 1 warning, 1 info (1 fixable)"
    assert not report and len(report) == 3
    assert [f.rule_id for f in report.at_least("warning")] == ["NW140", "NW180"]
    assert repr(report) == "<ScanReport 3 findings: 1 error, 1 warning, 1 info (1 fixable)>"


def test_html_is_escaped():
    report = ScanReport(tuple(scan_source('x = torch.ones(1, device="cuda")', "<b>.py")))
    html = report._repr_mimebundle_()["text/html"]
    assert "&lt;b&gt;.py" in html and "<b>.py" not in html
    assert "&quot;cuda&quot;" in html and 'class="nw-info"' in html
    assert ScanReport()._repr_mimebundle_()["text/plain"] == "no findings"
    assert ScanReport()  # a clean report is truthy


def test_json_document():
    doc = ScanReport(tuple(scan_source(SRC, "s.py")), "tpu").to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["schema_version"] == 1 and doc["target"] == "tpu"
    assert doc["summary"] == summarize(scan_source(SRC, "s.py"))
    assert doc["summary"]["by_rule"] == {"NW102": 1, "NW140": 1, "NW180": 1}


def test_scan_cell_for_the_neuron_report_tab():
    report = scan_cell("%%neuron\nx = t.cuda()\n")
    assert [(f.rule_id, f.line) for f in report] == [("NW102", 2)]
    assert scan_cell("x = (") == ScanReport()  # unparsable cells are the run's problem


def test_migration_text():
    migration = migrate_source(SRC, path="s.py")
    text = migration.to_text()
    assert text.startswith("--- a/s.py\n+++ b/s.py\n")
    assert text.endswith(
        "1 rewritten; remaining: 2 findings: 1 error, 1 warning, 0 info (0 fixable)"
    )
    assert "<pre" in migration._repr_mimebundle_()["text/html"]


def test_readme_rule_table_is_in_sync():
    readme = Path(__file__).resolve().parents[2] / "workbench/neuron_workbench/scan/README.md"
    assert rules_markdown() in readme.read_text()
    assert all(f"| {rule_id} |" in readme.read_text() for rule_id in RULES)
