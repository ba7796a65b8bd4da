"""The rule registry: every :class:`~neuron_workbench.scan.rule.Rule` by id, in id order.

Rules are declared next to their checks, one module per rule area in :mod:`.checks`; this module
only collects them (and checks that no id is declared twice). See :mod:`.rule` for what a rule is
and what the severities mean.
"""

from __future__ import annotations

from neuron_workbench.scan.checks import AREAS, Area
from neuron_workbench.scan.rule import SEVERITY_ORDER, Rule, Severity

__all__ = ["RULES", "SEVERITY_ORDER", "Rule", "Severity", "get_rule", "rules_markdown"]


def _collect(areas: tuple[Area, ...]) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for area in areas:
        for rule in area.rules:
            if rule.id in rules:
                raise RuntimeError(f"rule {rule.id} is declared twice (area {area.name})")
            rules[rule.id] = rule
    return dict(sorted(rules.items()))


#: Every rule by id, in id order.
RULES: dict[str, Rule] = _collect(AREAS)


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
