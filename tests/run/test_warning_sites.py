import inspect
import warnings

import torch
import torch.nn.functional as F

from neuron_workbench.backends import get_backend
from neuron_workbench.run.cuda_on_host import CudaOnHost
from neuron_workbench.run.remap import cuda_remapped_to


def test_a_warning_under_the_mode_names_the_line_that_called_torch():
    # torch.tensor(tensor) warns in C++, F.softmax without dim in Python (stacklevel=2): both named
    # the mode's __torch_function__ line; plain code names the caller's.
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shown = warnings.showwarning
        with cuda_remapped_to(get_backend("cpu"), host=CudaOnHost([])):
            assert warnings.showwarning is not shown
            line = inspect.currentframe().f_lineno + 1
            F.softmax(x)
            torch.tensor(x)
        assert warnings.showwarning is shown  # put back when the run ends
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line), (__file__, line + 1)]
