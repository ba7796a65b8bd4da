"""Every rule fires on its positive snippets and stays silent on its look-alikes."""

import textwrap

import pytest

from neuron_workbench.scan import RULES, Finding, get_rule, scan_source

# rule id -> (positive snippets, negative snippets). Each snippet is a whole module.
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
    "NW103": (
        [
            "import torch\ntorch.cuda.synchronize()",
            "import torch as T\nT.cuda.empty_cache()",
            "from torch import cuda\nn = cuda.device_count()",
            "from torch.cuda import synchronize\nsynchronize()",
            "import torch\ns = torch.cuda.Stream()",
            "import torch\nok = torch.cuda.is_available()",
        ],
        [
            "import torch\ntorch.neuron.synchronize()",
            "cuda.synchronize()",
            "import numpy as torch_like\ntorch_like.cuda.synchronize()",
            "import torch\ntorch.accelerator.synchronize()",
        ],
    ),
    "NW104": (
        [
            "import torch\ntorch.cuda.get_device_capability()",
            "import torch\ntorch.cuda.nvtx.range_push('x')",
            "import torch\ntorch.cuda.mem_get_info()",
            "import torch\nt = torch.cuda.FloatTensor(3)",
        ],
        [
            "import torch\ntorch.neuron.get_device_name()",
            "get_device_capability()",
            "import torch\ntorch.cuda.get_device_name(0)",
        ],
    ),
    "NW105": (
        [
            "import torch\ng = torch.cuda.CUDAGraph()",
            "import torch\nwith torch.cuda.graph(g):\n    pass",
            "import torch\nf = torch.cuda.make_graphed_callables(m, (x,))",
        ],
        ["graph = build_graph()", "import torch\ng = torch.fx.Graph()"],
    ),
    "NW106": (
        ["ok = x.is_cuda", "if not t.is_cuda:\n    pass"],
        ["ok = x.is_neuron", "is_cuda = False", "ok = is_cuda"],
    ),
    "NW107": (
        [
            "from torch.cuda.amp import autocast",
            "from torch import cuda",
            "from torch.cuda import synchronize",
        ],
        [
            "from torch import autocast",
            "import torch.cuda_helpers_not_torch as x",
            "from torch.amp import GradScaler",
        ],
    ),
    "NW110": (
        [
            'import torch\nwith torch.autocast("cuda"):\n    pass',
            'import torch\nwith torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast():\n    pass",
            "from torch.cuda.amp import autocast\nwith autocast():\n    pass",
            'import torch\nwith torch.amp.autocast("cuda"):\n    pass',
        ],
        [
            'import torch\nwith torch.autocast("neuron", dtype=torch.bfloat16):\n    pass',
            'import torch\nwith torch.autocast("cpu"):\n    pass',
            "def autocast():\n    pass\n\nwith autocast():\n    pass",
        ],
    ),
    "NW111": (
        [
            'import torch\nwith torch.autocast("cuda"):\n    pass',
            'import torch\nwith torch.autocast("neuron"):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast():\n    pass",
            "import torch\nwith torch.autocast(device_type=dev.type):\n    pass",
        ],
        [
            'import torch\nwith torch.autocast("neuron", dtype=torch.bfloat16):\n    pass',
            'import torch\nwith torch.autocast("cpu"):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast(True, torch.bfloat16):\n    pass",
        ],
    ),
    "NW112": (
        [
            'import torch\nwith torch.autocast("cuda", dtype=torch.float16):\n    pass',
            "import torch\nwith torch.cuda.amp.autocast(dtype=torch.half):\n    pass",
        ],
        [
            'import torch\nwith torch.autocast("cuda", dtype=torch.bfloat16):\n    pass',
            'import torch\nwith torch.autocast("cpu", dtype=torch.float16):\n    pass',
            "import torch\nx = y.to(torch.float16)",
        ],
    ),
    "NW113": (
        [
            "import torch\ns = torch.cuda.amp.GradScaler()",
            "from torch.cuda.amp import GradScaler\ns = GradScaler()",
            "import torch\ns = torch.amp.GradScaler()",
            'import torch\ns = torch.amp.GradScaler("cuda")',
            "from torch.amp import GradScaler\ns = GradScaler(init_scale=1024)",
        ],
        [
            'import torch\ns = torch.amp.GradScaler("neuron")',
            "import torch\ns = torch.amp.GradScaler(device=dev)",
            "class GradScaler:\n    pass\n\ns = GradScaler()",
        ],
    ),
    "NW120": (
        [
            "import torch\ntorch.backends.cudnn.benchmark = True",
            "import torch\ntorch.backends.cudnn.deterministic = True",
            "from torch.backends import cudnn\ncudnn.enabled = False",
        ],
        ["import torch\ntorch.use_deterministic_algorithms(True)", "cudnn.benchmark = True"],
    ),
    "NW121": (
        [
            "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True",
            "import torch\ntorch.backends.cuda.enable_flash_sdp(False)",
        ],
        ['import torch\ntorch.set_float32_matmul_precision("high")', "backends.cuda.x = 1"],
    ),
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
    "NW140": (
        [
            'import torch.distributed as dist\ndist.init_process_group("nccl")',
            'import torch.distributed as dist\ndist.init_process_group(backend="nccl", rank=0)',
            'import torch.distributed as dist\ng = dist.new_group([0, 1], backend="nccl")',
            "import torch.distributed as dist\nb = dist.Backend.NCCL",
            'import torch.distributed as dist\ndist.init_process_group("cpu:gloo,cuda:nccl")',
        ],
        [
            'import torch.distributed as dist\ndist.init_process_group("neuron")',
            'print("nccl")',
            'import torch.distributed as dist\ndist.init_process_group(backend="gloo")',
        ],
    ),
    "NW150": (
        [
            'import torch\nm = torch.compile(m, mode="max-autotune")',
            'import torch\n@torch.compile(mode="reduce-overhead")\ndef f(x):\n    return x',
        ],
        [
            'import torch\nm = torch.compile(m, mode="default")',
            "import torch\nm = torch.compile(m)",
            'mode = "max-autotune"',
        ],
    ),
    "NW151": (
        ["import torch\nm = torch.compile(m, dynamic=True)"],
        ["import torch\nm = torch.compile(m, dynamic=False)", "f(dynamic=True)"],
    ),
    "NW152": (
        [
            'import torch\nm = torch.compile(m, backend="inductor")',
            'import torch\nm = torch.compile(m, backend="cudagraphs")',
        ],
        [
            'import torch\nm = torch.compile(m, backend="neuron")',
            'import torch\nm = torch.compile(m, backend="aot_eager")',
        ],
    ),
    "NW160": (
        [
            "from torch.utils.cpp_extension import load_inline\n"
            "e = load_inline('x', cpp_sources=c, cuda_sources=k)",
            "from torch.utils.cpp_extension import load\ne = load('x', ['a.cpp', 'k.cu'])",
            "from torch.utils.cpp_extension import CUDAExtension\ne = CUDAExtension('x', ['k.cu'])",
            "import torch.utils.cpp_extension as ext\ne = ext.load('x', ['a.cpp'], with_cuda=True)",
        ],
        [
            "from torch.utils.cpp_extension import load_inline\n"
            "e = load_inline('x', cpp_sources=c, functions=['f'])",
            "from torch.utils.cpp_extension import load\ne = load('x', ['a.cpp'])",
            "e = load_inline('x', cuda_sources=k)",
        ],
    ),
    "NW161": (
        [
            "import triton\n@triton.jit\ndef k(x):\n    pass",
            "from numba import cuda\n@cuda.jit\ndef k(x):\n    pass",
            "import cupy\nk = cupy.RawKernel(src, 'k')",
            "import triton\n@triton.autotune(configs=[], key=[])\ndef k(x):\n    pass",
        ],
        [
            "import torch\n@torch.jit.script\ndef f(x):\n    return x",
            "from numba import jit\n@jit\ndef f(x):\n    return x",
            "@jit\ndef f(x):\n    return x",
        ],
    ),
    "NW170": (
        [
            "import apex",
            "from apex.optimizers import FusedAdam",
            "import bitsandbytes as bnb",
            "from flash_attn import flash_attn_func",
            "import xformers.ops",
            "import triton",
            "import cupy as cp",
            "from numba import cuda",
            "import numba.cuda",
            "import pynvml",
        ],
        [
            "import numba",
            "from numba import jit",
            "import torch",
            "import apexlike",
            "import flash",
        ],
    ),
    "NW180": (
        [
            "import torch\nx = torch.zeros(2, dtype=torch.float64)",
            "import torch\ntorch.set_default_dtype(torch.double)",
            "y = x.double()",
        ],
        [
            "import numpy as np\nx = np.float64(1)",
            "import torch\nx = torch.zeros(2)",
            "y = x.double(2)",
            "double = 2.0",
        ],
    ),
    "NW181": (
        [
            "import torch\nx = torch.full((2,), 2**40)",
            "y = ids * 6364136223846793005",
            "import torch\nt = torch.tensor([3_000_000_000])",
            "import torch\nm = torch.iinfo(torch.int64).max",
        ],
        [
            "import torch\nx = torch.full((2,), 2**31 - 1)",
            "N = 2**40",
            "import torch\ntorch.manual_seed(2**32)",
            "import torch\nx = torch.tensor([-2**31])",
            "y = ids * 1000",
        ],
    ),
    "NW182": (
        [
            "import torch\nx = torch.zeros(2, dtype=torch.complex64)",
            "import torch\nz = torch.view_as_complex(x)",
            "import torch\ns = torch.fft.rfft(x)",
            "import torch\nz = torch.complex(a, b)",
        ],
        [
            "import torch\nr = torch.view_as_real(z)",
            "z = complex(1, 2)",
            "import torch\nf = torch.fft",
        ],
    ),
    "NW190": (
        [
            'import torch\ng = torch.Generator(device="cuda")',
            'import torch\ng = torch.Generator("cuda:0")',
            'import torch\ng = torch.Generator(torch.device("cuda"))',
        ],
        [
            "import torch\ng = torch.Generator()",
            'import torch\ng = torch.Generator(device="cpu")',
            'g = Generator(device="cuda")',
        ],
    ),
    "NW191": (
        [
            "from torch.utils.data import DataLoader\nl = DataLoader(ds, pin_memory=True)",
            "y = x.pin_memory()",
        ],
        [
            "from torch.utils.data import DataLoader\nl = DataLoader(ds, pin_memory=False)",
            "pin_memory = True",
        ],
    ),
    "NW192": (
        [
            'import torch.multiprocessing as mp\nmp.set_start_method("fork")',
            'import multiprocessing\nctx = multiprocessing.get_context("fork")',
        ],
        ['import torch.multiprocessing as mp\nmp.set_start_method("spawn")', 'fork("x")'],
    ),
    "NW193": (
        [
            "import torch\nm = m.to(memory_format=torch.channels_last)",
            "import torch\nx = x.contiguous(memory_format=torch.channels_last_3d)",
        ],
        [
            "import torch\nx = x.contiguous(memory_format=torch.contiguous_format)",
            "channels_last = True",
        ],
    ),
}


def ids(source):
    return [f.rule_id for f in scan_source(textwrap.dedent(source), "snippet.py")]


def test_every_rule_has_positive_and_negative_cases():
    assert set(CASES) == set(RULES)
    for rule_id, (positives, negatives) in CASES.items():
        assert positives and negatives, rule_id


@pytest.mark.parametrize(
    ("rule_id", "source"),
    [(r, s) for r, (pos, _) in CASES.items() for s in pos],
)
def test_rule_fires(rule_id, source):
    assert rule_id in ids(source)


@pytest.mark.parametrize(
    ("rule_id", "source"),
    [(r, s) for r, (_, neg) in CASES.items() for s in neg],
)
def test_rule_stays_silent_on_lookalike(rule_id, source):
    assert rule_id not in ids(source)


def test_registry_is_consistent():
    for rule_id, rule in RULES.items():
        assert rule.id == rule_id and rule_id.startswith("NW") and len(rule_id) == 5
        assert rule.severity in ("info", "warning", "error")
        assert "shared/notes/" in rule.source, rule_id  # every rule names its vendor fact
        assert rule.message and rule.suggestion
    assert get_rule("NW101").fixable
    assert {r.id for r in RULES.values() if r.fixable} == {
        "NW101",
        "NW102",
        "NW103",
        "NW106",
        "NW110",
        "NW113",
    }
    # Severities encode "will not run" vs "runs but differs" vs "rename".
    assert {r.id for r in RULES.values() if r.severity == "error"} >= {
        "NW140",
        "NW151",
        "NW160",
        "NW161",
        "NW170",
        "NW190",
    }


def test_findings_carry_rule_data_and_linter_position():
    source = 'import torch\n\nx = torch.ones(1, device="cuda")  # comment with cuda\n'
    (finding,) = scan_source(source, "train.py")
    assert isinstance(finding, Finding)
    assert (finding.line, finding.col) == (3, 26)  # 1-based, at the string
    assert finding.format() == (
        'train.py:3:26: NW101 [*] device string "cuda" names a CUDA GPU (`device=`)'
    )
    assert finding.format(suggestion=True).endswith('\n    help: use "neuron"')
    assert finding.to_dict()["rule_id"] == "NW101" and finding.to_dict()["cell"] is None
    assert finding.source == RULES["NW101"].source


def test_columns_count_characters_not_bytes():
    (finding,) = scan_source('s = "é"; x = t.cuda()', "u.py")
    assert finding.col == 16  # byte offset would be 17


def test_method_call_position_points_at_cuda():
    (finding,) = scan_source("model = Net(\n    3\n).cuda()", "m.py")
    assert (finding.line, finding.col) == (3, 3)


def test_tpu_target_wording_and_mappings():
    found = scan_source(
        'import torch\ntorch.cuda.set_device(0)\ntorch.cuda.manual_seed(1)\nx = t.to("cuda")\n',
        "t.py",
        target="tpu",
    )
    by_rule = {(f.line, f.rule_id): f for f in found}
    assert "torch.accelerator.set_device_index" in by_rule[(2, "NW103")].suggestion
    assert by_rule[(2, "NW103")].fixable
    assert not by_rule[(3, "NW103")].fixable  # no torch.accelerator seeding API
    assert by_rule[(4, "NW101")].suggestion == 'use "tpu"'


def test_unknown_target_is_a_usage_error():
    from neuron_workbench.errors import WorkbenchUsageError

    with pytest.raises(WorkbenchUsageError):
        scan_source("x = 1", target="gpu")


def test_syntax_error_names_path_and_line():
    from neuron_workbench.scan import ScanSyntaxError

    with pytest.raises(ScanSyntaxError, match=r"^bad\.py:2:\d+: cannot parse"):
        scan_source("x = 1\ny = (\n", "bad.py")


def test_ipython_lines_are_skipped_in_cells_but_not_in_files():
    cell = "%matplotlib inline\n!nvidia-smi\nfiles = !ls\nx = t.cuda()\nobj?\n"
    (finding,) = scan_source(cell)
    assert (finding.rule_id, finding.line) == ("NW102", 4)
    from neuron_workbench.scan import ScanSyntaxError

    with pytest.raises(ScanSyntaxError):
        scan_source(cell, "script.py")


def test_percent_continuation_line_in_a_cell_is_python():
    cell = 'msg = ("%s"\n       % name)\nx = t.cuda()\n'
    assert [f.line for f in scan_source(cell)] == [3]


def test_cell_magics():
    assert [f.line for f in scan_source("%%neuron --target neuron\nx = t.cuda()\n")] == [2]
    assert [f.line for f in scan_source("%%time\nx = t.cuda()\n")] == [2]
    assert scan_source("%%bash\necho x.cuda()\n") == []
    assert [f.line for f in scan_source("%%writefile train.py\nx = t.cuda()\n")] == [2]
    assert scan_source("%%writefile notes.txt\nnot python (\n") == []


def test_namespace_imports_resolve_aliases_from_other_cells():
    src = "T.cuda.synchronize()\nwith autocast():\n    pass\n"
    assert ids(src) == []
    found = scan_source(src, imports={"T": "torch", "autocast": "torch.cuda.amp.autocast"})
    assert {f.rule_id for f in found} == {"NW103", "NW110", "NW111"}
