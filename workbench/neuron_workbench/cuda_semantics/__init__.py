"""CUDA's semantics, reproduced with plain PyTorch for other devices.

What a CUDA GPU does that the CPU does not, written so that the host standing in for ``cuda``
(``run.cuda_on_host``) and the emulated ``neuron``/``tpu`` devices (``emulator``) compute alike:
CUDA's autocast op lists (:mod:`.autocast`), recurrent layers as ATen runs them on a GPU-like
device (:mod:`.rnn`) and attention where a cell leaves only CUDA's own kernels on
(:mod:`.attention`). A leaf: it imports only torch.
"""
