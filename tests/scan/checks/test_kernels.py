"""Custom GPU code (NW160, NW161): each rule fires on its snippets and not on look-alikes."""

from area_cases import AreaCases

from neuron_workbench.scan.checks import kernels

# rule id -> (positive snippets, look-alike snippets). Each snippet is a whole module.
CASES = {
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
}


class TestRules(AreaCases):
    area = kernels.AREA
    cases = CASES
