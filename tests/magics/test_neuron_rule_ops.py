"""%%neuron on the default path: the target run's facts count the ops each numeric rule touched."""

from neuron_workbench.testing import run_cell


def _rule_ops(ip, cell, target):
    run_cell(ip, f"%%neuron --target {target} -o r\nimport torch\n{cell}")
    report = ip.user_ns["r"]
    assert report.target.error is None, report.summary()
    # the reference (cpu standing in for cuda) runs no emulated rule
    assert report.ref.facts.rule_ops == {}
    return report.target.facts.rule_ops


def test_a_float32_matmul_on_tpu_counts(ip):
    cell = "x = torch.randn(8, 8).cuda()\ny = torch.nn.functional.linear(x, x)"
    assert _rule_ops(ip, cell, "tpu") == {
        "tpu-matmul": 1,
        "tpu-matmul-1pass": 1,
        "fp64": 0,
        "int64": 0,
        "int64-wrapped": 0,
        "fp64-rounded": 0,
    }


def test_an_int_only_cell_on_tpu_counts_no_matmul(ip):
    cell = "n = torch.arange(16).reshape(4, 4).cuda()\ny = (n @ n).sum()"
    assert _rule_ops(ip, cell, "tpu")["tpu-matmul"] == 0


def test_a_float64_add_on_neuron_counts_fp64_and_is_serialised(ip):
    cell = "a = torch.ones(4, dtype=torch.float64).cuda()\nb = a + a"
    assert _rule_ops(ip, cell, "neuron")["fp64"] == 1
    assert ip.user_ns["r"].to_dict()["target"]["facts"]["rule_ops"]["fp64"] == 1


def test_int64_ops_on_neuron_count_the_ones_that_wrapped_and_are_serialised(ip):
    cell = "i = torch.arange(4).cuda()\nsmall = i * 3\nbig = torch.full((4,), 70000).cuda() ** 2"
    counts = _rule_ops(ip, cell, "neuron")
    assert (counts["int64"], counts["int64-wrapped"]) == (2, 1)
    assert ip.user_ns["r"].to_dict()["target"]["facts"]["rule_ops"]["int64-wrapped"] == 1
