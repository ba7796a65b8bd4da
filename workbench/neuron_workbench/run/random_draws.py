"""Random draws in a run: which count as device draws, their fingerprints, drawing on the CPU.

Both runs fingerprint every draw (its first numbers; for dropout, where its zeros are), so a report
can tell whether two devices saw the same random numbers before it blames them for a difference.
``--rng cpu`` draws device numbers with the CPU generator and moves them, so a real GPU and a real
accelerator see the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: How many leading numbers of a draw its fingerprint keeps.
FINGERPRINT_LENGTH = 8
#: The functional dropout (drawn on the CPU under ``--rng cpu``).
F_DROPOUT = torch.nn.functional.dropout


def draws_on_device(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    on_device: Callable[[Any], bool],
    named_cuda: bool = False,
) -> bool:
    """Whether a random call draws on an accelerator (CPU draws are the same on both runs).

    ``on_device`` tells whether a tensor is on the run's device; ``named_cuda`` whether the call
    asked for "cuda" (on the host standing in for cuda, the device argument now says "cpu").
    """
    if func in RANDOM_FACTORIES:
        device = kwargs.get("device")
        if device is not None:
            return named_cuda or torch.device(device).type != "cpu"
        if func in RANDOM_LIKE and args and isinstance(args[0], torch.Tensor):
            return on_device(args[0])
        return torch.get_default_device().type != "cpu"
    return bool(args) and on_device(args[0])


def fingerprint(value: Any, zeros_only: bool = False) -> tuple[Any, ...]:
    """A few leading numbers of a random draw (or, for dropout, where its zeros are).

    Comparing the two runs' fingerprints tells whether both saw the same random numbers. It is read
    with every mode off, so profiles and fallback reports never see it.
    """
    if not isinstance(value, torch.Tensor):
        return ()
    shape = tuple(value.shape)
    # A draw inside torch.func.vmap(..., randomness="different") is a batched wrapper, which has
    # no storage to read (reading it raised in the cell): read the tensor it wraps, all its rows.
    while torch._C._functorch.is_functorch_wrapped_tensor(value):
        value = torch._C._functorch.get_unwrapped(value)
    if value.is_meta or value.layout != torch.strided:
        return (shape,)  # no values to read (a model built on the meta device)
    if torch._C._len_torch_dispatch_stack() == 0:  # nothing to hide the reads from (the usual case)
        # reads of a detached tensor record no autograd graph
        return _head(value, shape, zeros_only)
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad():
        return _head(value, shape, zeros_only)


def _head(value: torch.Tensor, shape: tuple[int, ...], zeros_only: bool) -> tuple[Any, ...]:
    head = value.detach().reshape(-1)[:FINGERPRINT_LENGTH].to("cpu")
    if zeros_only:
        head = head == 0
    elif head.is_floating_point() or head.is_complex():
        if head.is_complex():
            # its real and imaginary parts: casting it to float64 dropped the imaginary part, with
            # torch's "Casting complex values to real" warning in the cell's output
            head = torch.view_as_real(head.resolve_conj()).reshape(-1)  # (a conj view has none)
        head = head.to(torch.float64)
    return (shape, *head.tolist())


def draw_on_cpu(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Draw with the CPU generator, then place the numbers where the cell asked for them."""
    if func in RANDOM_FACTORIES:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type != "cpu":
            return func(*args, **{**kwargs, "device": "cpu"}).to(device)
        if func in RANDOM_LIKE and args and args[0].device.type != "cpu":
            like = args[0]
            return func(like.cpu(), *args[1:], **kwargs).to(like.device)
        return func(*args, **kwargs)
    # in-place draws (Tensor.normal_ ... and torch.nn.init's random initialisers)
    tensor = args[0]
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "cpu":
        return func(*args, **kwargs)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
    func(host, *args[1:], **kwargs)
    with torch.no_grad():
        tensor.copy_(host)
    return tensor


def dropout_from_cpu(x: torch.Tensor, p: float, inplace: bool) -> torch.Tensor:
    """Dropout with a mask drawn by the CPU generator (``--rng cpu``)."""
    keep = torch.empty(x.shape, dtype=x.dtype, device="cpu").bernoulli_(1 - p).to(x.device)
    scaled = keep / (1 - p) if p < 1 else keep
    return x.mul_(scaled) if inplace else x * scaled


def original_function(func: Any) -> Any:
    """The function the dispatcher reports for ``func`` (the emulator wraps some factories)."""
    return getattr(func, "__wrapped__", func)


RANDOM_LIKE = frozenset(
    original_function(f) for f in (torch.randn_like, torch.rand_like, torch.randint_like)
)
RANDOM_FACTORIES = frozenset(
    {
        *(
            original_function(f)
            for f in (
                torch.randn,
                torch.rand,
                torch.randint,
                torch.randperm,
                torch.normal,
                torch.bernoulli,
                torch.multinomial,
                torch.poisson,
            )
        ),
        *RANDOM_LIKE,
    }
)
RANDOM_IN_PLACE = frozenset(
    {
        torch.Tensor.normal_,
        torch.Tensor.uniform_,
        torch.Tensor.bernoulli_,
        torch.Tensor.random_,
        torch.Tensor.exponential_,
        torch.Tensor.geometric_,
        torch.Tensor.log_normal_,
        torch.Tensor.cauchy_,
        torch.nn.init.uniform_,
        torch.nn.init.normal_,
        torch.nn.init.trunc_normal_,
        torch.nn.init.kaiming_uniform_,
        torch.nn.init.kaiming_normal_,
        torch.nn.init.xavier_uniform_,
        torch.nn.init.xavier_normal_,
        torch.nn.init.orthogonal_,
        torch.nn.init.sparse_,
    }
)
DROPOUTS = frozenset(
    {
        F_DROPOUT,
        torch.nn.functional.dropout1d,
        torch.nn.functional.dropout2d,
        torch.nn.functional.dropout3d,
        torch.nn.functional.alpha_dropout,
        torch.nn.functional.feature_alpha_dropout,
    }
)
