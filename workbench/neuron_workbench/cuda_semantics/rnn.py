"""Recurrent layers the way PyTorch runs them on a GPU-like device, written with primitive ops.

Off the CPU, ``torch.lstm``/``torch.gru`` step through time with two matmuls per step and a fused
cell kernel (``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell``) that accumulates in float32 and
rounds its outputs once to the input's precision. On the CPU they pre-compute input projections,
use unfused cells, and under autocast oneDNN's kernel, which CUDA's autocast lists do not cast.

The emulated devices register the fused cells from here, and the host standing in for ``cuda``
runs whole layers through :func:`lstm_device_path`/:func:`gru_device_path` (and their
``packed_`` forms for a ``pack_padded_sequence`` input) under autocast, so both
sides of a comparison compute recurrent layers alike. (CUDA itself runs cuDNN's RNN kernel when
cuDNN is enabled; no CPU reproduces its internal summation order.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

_LOW = (torch.float16, torch.bfloat16)


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in _LOW else t.dtype


def fused_lstm_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    cx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_thnn_fused_lstm_cell``: gates summed and activated in float32, outputs rounded once."""
    acc = _acc(input_gates)
    gates = input_gates.to(acc) + hidden_gates.to(acc)
    if input_bias is not None:
        gates = gates + input_bias.to(acc)
    if hidden_bias is not None:
        gates = gates + hidden_bias.to(acc)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx.to(acc) + i * g
    hy = o * cy.tanh()
    dtype = input_gates.dtype
    return hy.to(dtype), cy.to(dtype), gates.new_empty(0)


def fused_gru_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    hx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_thnn_fused_gru_cell``, in float32 with outputs rounded once."""
    acc = _acc(input_gates)
    ig, hg = input_gates.to(acc), hidden_gates.to(acc)
    if input_bias is not None:
        ig = ig + input_bias.to(acc)
    if hidden_bias is not None:
        hg = hg + hidden_bias.to(acc)
    ir, ii, in_ = ig.chunk(3, 1)
    hr, hi, hn = hg.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx.to(acc) - n)
    return hy.to(input_gates.dtype), input_gates.new_empty(0)


def cast_float32(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with its float32 tensors (also inside lists and tuples) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.dtype == torch.float32 else value
    if isinstance(value, list | tuple):
        return type(value)(cast_float32(v, dtype) for v in value)
    return value


def _autocast_cast(*tensors: Any) -> tuple[Any, ...]:
    """What autocast's lower-precision policy does to a fused cell's inputs."""
    if not torch.is_autocast_enabled("cpu"):
        return tensors
    return cast_float32(tensors, torch.get_autocast_dtype("cpu"))


def _packed_device_path(func: Any, args: tuple[Any, ...]) -> Callable[[], Any] | None:
    """:func:`device_path` for the packed forms.

    Their arguments: (data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
    bidirectional).
    """
    if not _no_projections(args[3], args[4], args[5], args[8]):
        return None
    if func is torch.lstm and isinstance(args[2], list | tuple) and len(args[2]) == 2:
        return lambda: packed_lstm_device_path(*args)
    if func is torch.gru and isinstance(args[2], torch.Tensor):
        return lambda: packed_gru_device_path(*args)
    return None


def _weights(
    params: Sequence[torch.Tensor], index: int, has_biases: bool
) -> tuple[Any, Any, Any, Any]:
    """``(w_ih, w_hh, b_ih, b_hh)`` of layer-direction ``index`` (biases None without them)."""
    per = 4 if has_biases else 2
    w_ih, w_hh, *biases = params[index * per : (index + 1) * per]
    b_ih, b_hh = biases if has_biases else (None, None)
    return w_ih, w_hh, b_ih, b_hh


def _cell_update(
    x: torch.Tensor,
    state: list[torch.Tensor],
    weights: tuple[Any, Any, Any, Any],
    step: Callable[..., tuple[torch.Tensor, ...]],
) -> list[torch.Tensor]:
    """One cell update at one time step: the two matmuls, then ``step`` (the fused cell)."""
    w_ih, w_hh, b_ih, b_hh = weights
    igates = torch.matmul(x, w_ih.t())
    hgates = torch.matmul(state[0], w_hh.t())
    return list(step(igates, hgates, state, b_ih, b_hh))


def _no_projections(
    params: Sequence[torch.Tensor], has_biases: bool, num_layers: int, bidirectional: bool
) -> bool:
    """Whether ``params`` are plain LSTM/GRU weights: projections (proj_size) add one per layer."""
    per = 4 if has_biases else 2
    return len(params) == per * num_layers * (2 if bidirectional else 1)


def _layers(
    input: torch.Tensor,
    hidden: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
    step: Callable[..., tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """The layer/direction/time loops of ATen's device path; ``step`` is one cell update."""
    if batch_first:
        input = input.transpose(0, 1)
    directions = 2 if bidirectional else 1
    finals: list[list[torch.Tensor]] = [[] for _ in hidden]
    layer_input = input
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = _weights(params, index, has_biases)
            state = [h[index] for h in hidden]
            steps = range(layer_input.size(0))
            out: list[torch.Tensor] = [layer_input[0]] * layer_input.size(0)
            for t in reversed(steps) if direction else steps:
                state = _cell_update(layer_input[t], state, weights, step)
                out[t] = state[0]
            outputs.append(torch.stack(out))
            for slot, value in zip(finals, state):
                slot.append(value)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, -1)
        if dropout and train and layer < num_layers - 1:
            layer_input = torch.nn.functional.dropout(layer_input, dropout, training=True)
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, finals


def _lstm_step(igates: Any, hgates: Any, state: list, b_ih: Any, b_hh: Any) -> tuple:
    """One LSTM cell update from its gates, as the fused CUDA kernel makes it."""
    hy, cy, _ = fused_lstm_cell(*_autocast_cast(igates, hgates, state[1], b_ih, b_hh))
    return hy, cy


def _gru_step(igates: Any, hgates: Any, state: list, b_ih: Any, b_hh: Any) -> tuple:
    """One GRU cell update from its gates, as the fused CUDA kernel makes it."""
    hy, _ = fused_gru_cell(*_autocast_cast(igates, hgates, state[0], b_ih, b_hh))
    return (hy,)


def lstm_device_path(
    input: torch.Tensor,
    hx: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.lstm`` (padded input, no projections) as ATen runs it on a GPU-like device."""
    output, (hs, cs) = _layers(
        input,
        hx,
        params,
        has_biases,
        num_layers,
        dropout,
        train,
        bidirectional,
        batch_first,
        _lstm_step,
    )
    return output, torch.stack(hs), torch.stack(cs)


def gru_device_path(
    input: torch.Tensor,
    hx: torch.Tensor,
    params: Sequence[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.gru`` (padded input) as ATen runs it on a GPU-like device."""
    output, (hs,) = _layers(
        input,
        [hx],
        params,
        has_biases,
        num_layers,
        dropout,
        train,
        bidirectional,
        batch_first,
        _gru_step,
    )
    return output, torch.stack(hs)


def device_path(func: Any, args: tuple[Any, ...]) -> Callable[[], Any] | None:
    """A call of the device path for ``torch.lstm``/``torch.gru`` with these arguments, if it has one.

    The padded-input and packed-sequence forms without LSTM projections qualify (``proj_size``
    keeps PyTorch's own path).
    """
    # input forms: (input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
    # batch_first); the packed forms put batch_sizes second and parameters fourth.
    if len(args) == 9 and isinstance(args[1], torch.Tensor) and isinstance(args[3], list | tuple):
        return _packed_device_path(func, args)
    if len(args) != 9 or not isinstance(args[2], list | tuple):
        return None
    if not _no_projections(args[2], args[3], args[4], args[7]):
        return None
    if func is torch.lstm and isinstance(args[1], list | tuple) and len(args[1]) == 2:
        return lambda: lstm_device_path(*args)
    if func is torch.gru and isinstance(args[1], torch.Tensor):
        return lambda: gru_device_path(*args)
    return None


def _packed_layers(
    data: torch.Tensor,
    batch_sizes: torch.Tensor,
    hidden: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    step: Callable[..., tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """ATen's ``PackedLayer``/``ReversedPackedLayer`` loops on a GPU-like device.

    ``data`` holds the time steps one after the other, ``batch_sizes[t]`` rows each (decreasing):
    forward, a sequence that ended leaves its state behind; backward, each starts from its own
    initial state when it begins.
    """
    sizes = [int(b) for b in batch_sizes]
    offsets = [0, *itertools.accumulate(sizes)][:-1]  # where each step's rows start
    directions = 2 if bidirectional else 1
    finals: list[list[torch.Tensor]] = [[] for _ in hidden]
    layer_input = data
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = _weights(params, index, has_biases)
            initial = [h[index] for h in hidden]
            out: list[torch.Tensor] = []
            if direction == 0:
                state, ended, last = list(initial), [], sizes[0]
                for t, size in enumerate(sizes):
                    if size < last:  # sequences that ended keep their state
                        ended.append([s[size:last] for s in state])
                        state = [s[:size] for s in state]
                    last = size
                    x = layer_input.narrow(0, offsets[t], size)
                    state = _cell_update(x, state, weights, step)
                    out.append(state[0])
                ended.append(state)
                final = [torch.cat(parts[::-1], 0) for parts in zip(*ended)]
                outputs.append(torch.cat(out, 0))
            else:
                last = sizes[-1]
                state = [s[:last] for s in initial]
                for t in reversed(range(len(sizes))):
                    size = sizes[t]
                    if size > last:  # sequences that begin here start from their own state
                        state = [torch.cat([s, h[last:size]], 0) for s, h in zip(state, initial)]
                    last = size
                    x = layer_input.narrow(0, offsets[t], size)
                    state = _cell_update(x, state, weights, step)
                    out.append(state[0])
                final = state
                outputs.append(torch.cat(out[::-1], 0))
            for slot, value in zip(finals, final):
                slot.append(value)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, -1)
        if dropout and train and layer < num_layers - 1:
            layer_input = torch.nn.functional.dropout(layer_input, dropout, training=True)
    return layer_input, finals


def packed_lstm_device_path(
    data: torch.Tensor,
    batch_sizes: torch.Tensor,
    hx: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.lstm`` of a packed sequence (no projections) as ATen runs it on a GPU-like device."""
    output, (hs, cs) = _packed_layers(
        data,
        batch_sizes,
        hx,
        params,
        has_biases,
        num_layers,
        dropout,
        train,
        bidirectional,
        _lstm_step,
    )
    return output, torch.stack(hs), torch.stack(cs)


def packed_gru_device_path(
    data: torch.Tensor,
    batch_sizes: torch.Tensor,
    hx: torch.Tensor,
    params: Sequence[torch.Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.gru`` of a packed sequence as ATen runs it on a GPU-like device."""
    output, (hs,) = _packed_layers(
        data,
        batch_sizes,
        [hx],
        params,
        has_biases,
        num_layers,
        dropout,
        train,
        bidirectional,
        _gru_step,
    )
    return output, torch.stack(hs)
