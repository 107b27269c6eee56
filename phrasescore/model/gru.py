"""The gated recurrent unit (Cho et al. 2014, §2.3, eq. 5-8), written out.

With input projections ``x_r = W_r x``, ``x_z = W_z x``, ``x_h = W x`` computed for all time steps
at once (one large matrix product), each step is::

    r   = σ(x_r + U_r h_{t-1})                 (eq. 5, reset gate)
    z   = σ(x_z + U_z h_{t-1})                 (eq. 6, update gate)
    h~  = tanh(x_h + U (r ⊙ h_{t-1}))          (eq. 8, candidate)
    h_t = z ⊙ h_{t-1} + (1 - z) ⊙ h~           (eq. 7)

:func:`gru_encoder_step` is exactly eq. 5-8 (the reset gate applied *before* the product with U).
:func:`gru_decoder_step` is the decoder of Cho et al. Appendix A.1.1, where the summary c enters the
gates and the candidate: ``r, z = σ(W e(y) + U h + C c)`` and ``h~ = tanh(W e(y) + r ⊙ (U h + C c))``;
there the reset gate multiplies the product ``U h + C c`` (the same placement cuDNN uses), which lets
one matrix product per step serve all three parts. That placement is also the one of PyTorch's
fused GRU cell (``aten::_thnn_fused_gru_cell``: one CUDA kernel for the gates, the candidate and
eq. 7, and one for their gradients), so on a GPU the decoder's step is two kernels, the product
and the cell (:func:`gru_cell_from_gates`), where the written step is five: the same equations.

**The fused recurrence** (``ModelConfig.recurrence = "fused"``, ``train --recurrence fused``;
for GPUs, docs/benchmarks.md "Fused recurrences"): the encoders of cho and attention run :class:`torch.nn.GRU` (cuDNN's fused kernel on a
GPU, one call for the whole source; :func:`run_fused_gru`), and so does cho's teacher-forced
decoder, fed ``[e(y_{t-1}); c]`` each step (:mod:`phrasescore.model.encdec`: C c then enters the
candidate outside the reset gate, where :func:`gru_decoder_step` has it inside). Its GRU (PyTorch's ``torch.nn.GRU``
documentation, the cuDNN formulation) is::

    r   = σ(W_ir x + b_ir + W_hr h_{t-1} + b_hr)
    z   = σ(W_iz x + b_iz + W_hz h_{t-1} + b_hz)
    n   = tanh(W_in x + b_in + r ⊙ (W_hn h_{t-1} + b_hn))
    h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}

Gates and eq. 7 are eq. 5-7 (with a second bias vector b_h, which changes nothing but the
initial distribution); the candidate is not eq. 8: the reset gate multiplies the product
``U h + b_hn`` *after* it (``r ⊙ (U h)``) where eq. 8 multiplies the state *before* it
(``U (r ⊙ h)``). The two are different functions of the same weights (they agree only for r = 1),
so "fused" is a variant of the papers' model, not the papers' model: the paper presets refuse it
(``--preset paper``), and the written-out eq. 5-8 above stay the default everywhere. Its initial
weights are those of the written GRU (:func:`~phrasescore.model.initialization.init_fan_in`,
:func:`~phrasescore.model.initialization.init_cho`): input matrices and b_i as ``W x + b``,
recurrent matrices orthogonal per gate, b_h 0.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def gru_encoder_step(x_proj: Tensor, h: Tensor, u_rz: Tensor, u_h: Tensor) -> Tensor:
    """One GRU step, Cho et al. 2014 eq. 5-8.

    ``x_proj`` [B, 3H] holds ``[W_r x; W_z x; W x]`` (biases included), ``h`` [B, H] the previous
    state, ``u_rz`` [H, 2H] the recurrent matrices ``[U_r U_z]`` (transposed), ``u_h`` [H, H] U.

    Six kernels: the input terms enter the products as their bias (``addmm``), and eq. 7 is one
    ``lerp`` (``h~ + z ⊙ (h - h~)``).
    """
    hidden = h.shape[-1]
    # split/chunk, not slices: their backward is one concatenation, where each slice's is a
    # zero-filled copy of the whole input (docs/benchmarks.md, "bf16 output layer on the CPU")
    x_rz, x_h = x_proj.split([2 * hidden, hidden], dim=1)
    r, z = torch.sigmoid(torch.addmm(x_rz, h, u_rz)).chunk(2, dim=1)
    candidate = torch.tanh(torch.addmm(x_h, r * h, u_h))
    return torch.lerp(candidate, h, z)


def gru_cell_from_gates(input_gates: Tensor, hidden_gates: Tensor, h: Tensor) -> Tensor:
    """A GRU step from its two products, the reset gate on the second one's candidate part::

        r, z = σ(i_{r,z} + g_{r,z}),  h~ = tanh(i_h + r ⊙ g_h),  h_t = h~ + z ⊙ (h_{t-1} - h~)

    With ``input_gates`` i = ``[W_r e; W_z e; W e]`` and ``hidden_gates`` g = ``[U_r h + C_r c;
    U_z h + C_z c; U h + C c]`` (each [B, 3H]) this is the decoder of Cho et al. Appendix A.1.1.
    On CUDA it is PyTorch's fused GRU cell (``aten::_thnn_fused_gru_cell``, whose CPU reference
    is ``torch.gru_cell``'s: gates in the order reset, update, candidate), one kernel forward and
    one backward, computed in float32 whatever the inputs' precision; elsewhere the written
    kernels below. The inputs take their common precision, as the written step's would.
    """
    if h.is_cuda:
        dtype = torch.promote_types(
            torch.promote_types(input_gates.dtype, hidden_gates.dtype), h.dtype
        )
        return torch.ops.aten._thnn_fused_gru_cell(
            input_gates.to(dtype).contiguous(),
            hidden_gates.to(dtype).contiguous(),
            h.to(dtype).contiguous(),
        )[0]
    hidden = h.shape[-1]
    rz = torch.sigmoid(input_gates[:, : 2 * hidden] + hidden_gates[:, : 2 * hidden])
    r, z = rz[:, :hidden], rz[:, hidden:]
    candidate = torch.tanh(
        torch.addcmul(input_gates[:, 2 * hidden :], r, hidden_gates[:, 2 * hidden :])
    )
    return torch.lerp(candidate, h, z)


def gru_decoder_step(x_proj: Tensor, h: Tensor, u: Tensor, ctx_proj: Tensor) -> Tensor:
    """One decoder step of Cho et al. 2014, Appendix A.1.1 (summary c in gates and candidate).

    ``x_proj`` [B, 3H] = ``[W_r e; W_z e; W e]`` of the previous word, ``u`` [H, 3H] the recurrent
    matrices ``[U_r U_z U]`` (transposed), ``ctx_proj`` [B, 3H] = ``[C_r c; C_z c; C c]``, computed
    once per sequence: :func:`gru_cell_from_gates` of ``x_proj`` and ``U h + C c``.
    """
    return gru_cell_from_gates(x_proj, torch.addmm(ctx_proj, h, u), h)


def gru_decoder_loop_step(bias_t: Tensor, x_h_t: Tensor, h: Tensor, u: Tensor) -> Tensor:
    """One step of :func:`run_gru_decoder` off CUDA: :func:`gru_decoder_step` with the step's
    bias of the recurrent product ``bias_t`` = [W_r e + C_r c; W_z e + C_z c; C c] and candidate
    input ``x_h_t`` = W e built before the loop."""
    hidden = h.shape[-1]
    hh_rz, hh_h = torch.addmm(bias_t, h, u).split([2 * hidden, hidden], dim=1)
    r, z = torch.sigmoid(hh_rz).chunk(2, dim=1)
    candidate = torch.tanh(torch.addcmul(x_h_t, r, hh_h))
    return torch.lerp(candidate, h, z)


def run_gru_decoder(x_proj: Tensor, h0: Tensor, u: Tensor, ctx_proj: Tensor, step=None) -> Tensor:
    """:func:`gru_decoder_step` over all steps of ``x_proj`` [B, T, 3H]; the states [B, T, H].

    On CUDA (``step`` None) each step is two kernels: ``addmm`` (U h + C c) and the fused cell
    (:func:`gru_cell_from_gates`). Elsewhere, or with ``step`` given (the loop step compiled:
    ``train --compile``), one pass before the loop builds each step's bias of the recurrent
    product, time-major: ``[W_r e + C_r c; W_z e + C_z c; C c]`` (the candidate's C c stays
    inside the reset product), and each step (:func:`gru_decoder_loop_step`) is five kernels:
    ``addmm``, ``sigmoid``, ``addcmul``, ``tanh``, ``lerp``.
    """
    x_tm = x_proj.transpose(0, 1)  # [T, B, 3H] view
    h = h0
    states = []
    if step is None and x_proj.is_cuda:
        # unbind, not x_tm[t]: one backward node for all steps instead of a zero-filled
        # [T, B, 3H] gradient per step (quadratic in T)
        for x_t in x_tm.contiguous().unbind(0):
            h = gru_cell_from_gates(x_t, torch.addmm(ctx_proj, h, u), h)
            states.append(h)
        return torch.stack(states, dim=1)
    step = step or gru_decoder_loop_step
    hidden, steps = h0.shape[-1], x_proj.shape[1]
    gates = x_tm[..., : 2 * hidden] + ctx_proj[None, :, : 2 * hidden]
    bias = torch.cat([gates, ctx_proj[None, :, 2 * hidden :].expand(steps, -1, -1)], dim=2)
    x_h = x_tm[..., 2 * hidden :].contiguous()
    for bias_t, x_h_t in zip(bias.unbind(0), x_h.unbind(0), strict=True):  # unbind: see above
        h = step(bias_t, x_h_t, h, u)
        states.append(h)
    return torch.stack(states, dim=1)


def run_gru_encoder(
    x_proj: Tensor,
    h0: Tensor,
    u_rz: Tensor,
    u_h: Tensor,
    lengths: Tensor | None,
    keep_states: bool = True,
    step=gru_encoder_step,
) -> tuple[Tensor | None, Tensor]:
    """Run :func:`gru_encoder_step` (or ``step``, the same function compiled: ``train
    --compile``) over ``x_proj`` [B, S, 3H].

    Returns all states [B, S, H] (None with ``keep_states=False``) and the state after each
    sequence's last real token [B, H] (padded positions, after ``lengths``, leave the state
    unchanged). ``lengths=None`` means no padding.
    """
    x_tm = x_proj.transpose(0, 1).contiguous()  # each step's input terms contiguous
    h = h0
    states = []
    # unbind, not x_tm[t]: one backward node for all steps (see run_gru_decoder)
    for t, x_t in enumerate(x_tm.unbind(0)):
        h_new = step(x_t, h, u_rz, u_h)
        if lengths is not None:
            keep = (lengths > t).unsqueeze(1)
            h_new = torch.where(keep, h_new, h)
        h = h_new
        if keep_states:
            states.append(h)
    return (torch.stack(states, dim=1) if keep_states else None), h


_COMPILED: dict[object, object] = {}


def compiled_step(fn):
    """``fn`` (a step function of this module or a network's decoder step) under
    :func:`torch.compile`, one compiled function per ``fn`` (``train --compile``): its kernels
    fused into a few, the same equations. Shapes that repeat (``train --bucket``) reuse one
    compiled graph; others make PyTorch compile one with dynamic sizes. The compile mode is
    ``PHRASESCORE_COMPILE_MODE`` (e.g. ``reduce-overhead`` for CUDA graphs; default: PyTorch's
    default mode)."""
    import os

    key = getattr(fn, "__func__", fn)
    if key not in _COMPILED:
        mode = os.environ.get("PHRASESCORE_COMPILE_MODE") or None
        _COMPILED[key] = torch.compile(key, mode=mode)
    compiled = _COMPILED[key]
    owner = getattr(fn, "__self__", None)
    if owner is None:
        return compiled
    return lambda *args: compiled(owner, *args)


def run_fused_gru(gru: nn.GRU, x: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
    """``gru`` (a :class:`torch.nn.GRU` with ``batch_first``, one or two directions) over the
    inputs ``x`` [B, S, E] of rows of ``lengths`` real positions (None: every row full, no
    padding): (outputs [B, S, D·H], 0 at padded positions; final states [D, B, H], each after
    its row's last real position, the backward direction's after the first).

    A padded batch is packed (``pack_padded_sequence``, ``enforce_sorted=False``), so each row's
    result is what it is alone: the backward direction starts at its own last real token, and
    padding never enters a state. The cuDNN formulation (module docstring), not eq. 5-8.
    """
    steps = x.shape[1]
    if lengths is None:
        return gru(x)
    packed = nn.utils.rnn.pack_padded_sequence(
        x, lengths.cpu(), batch_first=True, enforce_sorted=False
    )
    outputs, last = gru(packed)
    outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs, batch_first=True, total_length=steps)
    return outputs, last
