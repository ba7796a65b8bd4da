"""CUDA's semantics, reproduced with plain PyTorch for other devices.

What a CUDA GPU does that the CPU does not, written so that the host standing in for ``cuda``
(``run.cuda_on_host``) and the emulated ``neuron``/``tpu`` devices (``emulator``) compute alike:
CUDA's autocast op lists (:mod:`.autocast`) and recurrent layers as ATen runs them on a GPU-like
device (:mod:`.rnn`). A leaf: it imports only torch.
"""
