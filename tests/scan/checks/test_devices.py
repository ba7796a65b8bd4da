"""Device placement (NW101, NW102, NW106): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan import migrate_source, scan_source
from neuron_workbench.scan.checks import devices

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
    "NW101": (
        [
            'import torch\nx = torch.zeros(2, device="cuda")',
            'import torch\nd = torch.device("cuda:1")',
            'x = y.to("cuda")',
            'device = "cuda"',
            'DEVICE = "cuda" if ok else "cpu"',
            'd = "cuda" if torch.cuda.is_available() else "cpu"',
            'import torch\nm = torch.load("m.pt", map_location="cuda:0")',
            'import torch\nd = torch.device(f"cuda:{rank}")',
            "if x.device.type == 'cuda':\n    pass",
            'def f(device="cuda"):\n    pass',
            'cfg = {"device": "cuda"}',
            'parser.add_argument("--device", default="cuda")',
            'dev = "cuda:0"\nmodel.to(dev)',
            'import torch\ntorch.set_default_device("cuda")',
        ],
        [
            'print("cuda")',
            'log.info("using cuda")',
            '# device = "cuda"\nx = 1',
            'names = ["cuda", "cpu"]',
            'x = y.to("cpu")',
            'device = "cudax"',
            'msg = "cuda:0 is busy"',
            'cuda = "cuda"',
            'd = torch.device("neuron")',
            'x = f"cuda {n}"',
        ],
    ),
    "NW102": (
        [
            "x = t.cuda()",
            "m = Net().cuda(0)",
            "y = x.cuda(non_blocking=True)",
            "class M(nn.Module):\n    def go(self):\n        return self.cuda()",
        ],
        [
            "def cuda():\n    return 1\n\ncuda()",
            "cuda = True",
            "x = args.cuda",
            "x = t.to('neuron')",
            "import torch\nok = torch.cuda",
        ],
    ),
    "NW106": (
        ["ok = x.is_cuda", "if not t.is_cuda:\n    pass"],
        ["ok = x.is_neuron", "is_cuda = False", "ok = is_cuda"],
    ),
}


class TestRules(AreaCases):
    area = devices.AREA
    cases = CASES


def test_a_device_choice_on_a_query_the_rewrite_leaves_is_changed_by_hand_only():
    # `"cuda" if tc.is_available() else "cpu"` became `"neuron" if tc.is_available() else "cpu"`:
    # tc is still torch.cuda, False on Trainium, so the migrated code ran on the CPU without a word
    source = (
        "import torch\nimport torch.cuda as tc\nfrom torch.cuda import is_available\n"
        'a = "cuda" if tc.is_available() else "cpu"\n'
        'b = torch.device("cuda" if is_available() else "cpu")\n'
        'c = "cuda" if torch.cuda.is_available() else "cpu"\n'
    )
    choices = [f for f in scan_source(source, "m.py") if f.rule_id == "NW101"]
    assert [(f.line, f.fixable) for f in choices] == [(4, False), (5, False), (6, True)]
    assert choices[0].suggestion == (
        'use "neuron", together with `tc.is_available()` in the condition, which stays '
        "torch.cuda's (False on neuron: this would pick the other device)"
    )
    assert "`is_available()` in the condition" in choices[1].suggestion
    migrated = migrate_source(source, path="m.py").new_source.splitlines()
    assert migrated[3:] == [
        'a = "cuda" if tc.is_available() else "cpu"',
        'b = torch.device("cuda" if is_available() else "cpu")',
        'c = "neuron" if torch.neuron.is_available() else "cpu"',
    ]
