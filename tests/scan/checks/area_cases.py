"""The tests every rule area gets: a test module subclasses :class:`AreaCases` and sets its
``area`` and ``cases`` (rule id -> (positive snippets, look-alike snippets), whole modules)."""

import textwrap

from neuron_workbench.scan import scan_source


def rule_ids(source, target="neuron"):
    """The rule ids found in a snippet scanned as ``snippet.py``."""
    return [f.rule_id for f in scan_source(textwrap.dedent(source), "snippet.py", target=target)]


class AreaCases:
    area = None
    cases: dict = {}

    def test_cases_cover_every_rule_of_the_area(self):
        assert set(self.cases) == {rule.id for rule in self.area.rules}
        for rule_id, (positives, lookalikes) in self.cases.items():
            assert positives and lookalikes, rule_id

    def test_rule_fires(self, rule_id, positive):
        assert rule_id in rule_ids(positive)

    def test_rule_stays_silent_on_lookalike(self, rule_id, lookalike):
        assert rule_id not in rule_ids(lookalike)
