"""CUDA environment variables (NW130): each rule fires on its snippets and not on look-alikes."""

from neuron_workbench.scan.checks import env

AREA = env.AREA

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW130": (
        [
            'import os\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"',
            'import os\nv = os.environ.get("CUDA_VISIBLE_DEVICES")',
            'import os\nv = os.getenv("CUDA_LAUNCH_BLOCKING")',
            'import subprocess\nsubprocess.run(cmd, env={"CUDA_VISIBLE_DEVICES": "1"})',
        ],
        [
            'print("set CUDA_VISIBLE_DEVICES=0 first")',
            'import os\nos.environ["NEURON_RT_VISIBLE_CORES"] = "0"',
            "# CUDA_VISIBLE_DEVICES\nx = 1",
        ],
    ),
}


def test_cases_cover_every_rule_of_the_area():
    assert set(CASES) == {rule.id for rule in AREA.rules}
    for rule_id, (positives, lookalikes) in CASES.items():
        assert positives and lookalikes, rule_id


def test_rule_fires(rule_id, positive, rule_ids):
    assert rule_id in rule_ids(positive)


def test_rule_stays_silent_on_lookalike(rule_id, lookalike, rule_ids):
    assert rule_id not in rule_ids(lookalike)
