"""RNNsearch: the attention encoder-decoder of Bahdanau et al. (2015), §3 and Appendix A.

Encoder (§3.2, A.2.1): a bidirectional GRU. The forward GRU reads ``x_1 .. x_Tx`` (the source
words and EOS), the backward GRU reads them in reverse; each is the GRU of Cho et al. 2014
eq. 5-8 (:func:`phrasescore.model.gru.gru_encoder_step`, the reset gate applied before the
product with U, exactly as A.2.1 writes it; A.2.1 writes ``h = (1 - z) ⊙ h_prev + z ⊙ h~`` where
gru.py writes ``z ⊙ h_prev + (1 - z) ⊙ h~``, the same function with z relabelled 1 - z). The
annotation of word j is ``h_j = [→h_j ; ←h_j]`` (2H units). The backward GRU of a padded row starts
at its own last real token: each row's real tokens are reversed in place, run forward and put back
(:func:`~phrasescore.model.lstm.reverse_within`). The GRUs are written out with gru.py rather than
:class:`torch.nn.GRU`, whose cuDNN formulation applies the reset gate after the product with U.
With ``recurrence="fused"`` (not in ``--preset paper``) the network is
:class:`FusedAttentionEncoderDecoder`, whose encoder is that bidirectional :class:`torch.nn.GRU`
over packed sequences instead (one cuDNN call on a GPU; the formulation difference:
:mod:`phrasescore.model.gru`); annotations, ←h_1 and everything after them are the same.

Alignment model (§3.1, A.1.2)::

    e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j)       (U_a h_j is computed once per source)
    α_ij = exp(e_ij) / Σ_k exp(e_ik)             over the real positions k of the source only
    c_i  = Σ_j α_ij h_j

The softmax is masked: padded positions get e = -inf, hence exactly 0 weight, so a source scores
the same alone or in a padded batch. The alignment layer has H units (n' = n = 1000 in the paper).

Decoder (A.2.2), a GRU whose input is the previous word and the context::

    r_i  = σ(W_r E y_{i-1} + U_r s_{i-1} + C_r c_i)
    z_i  = σ(W_z E y_{i-1} + U_z s_{i-1} + C_z c_i)
    s~_i = tanh(W E y_{i-1} + U (r_i ⊙ s_{i-1}) + C c_i)
    s_i  = z_i ⊙ s_{i-1} + (1 - z_i) ⊙ s~_i        (z relabelled as in the encoder)

with initial state ``s_0 = tanh(W_s ←h_1)`` (A.2.2): the backward GRU's state at the first word,
i.e. after it has read the whole source.

Output (A.2.2): ``t~_i = U_o s_i + V_o E y_{i-1} + C_o c_i`` (2l units), maxout with pools of 2 to
l units, ``p(y_i | y_<i, x) ∝ exp(y_iᵀ W_o t_i)``. The output reads the new state s_i, as in the
main text's eq. (4), ``p(y_i | ...) = g(y_{i-1}, s_i, c_i)``; the appendix writes s_{i-1} there.
``W_o = G_r G_l`` when ``output_rank`` R < l (low rank, as in Cho et al.; ``features`` = G_l t_i)
and ``W_o`` itself when R = l (``--preset paper``).

Initialisation (App. B.1, ``--preset paper``): recurrent matrices orthogonal; W_a and U_a
N(0, 0.001²); v_a and all biases 0; every other weight N(0, 0.01²) (``init_std``). The default
preset starts from PyTorch's fan-in scales instead (``init="fan_in"``,
:func:`~phrasescore.model.initialization.init_fan_in`; recurrent matrices still orthogonal). Dropout (default preset only; the paper
uses none) on embeddings and the maxout units.

The attention weights α of a pair are :meth:`AttentionEncoderDecoder.attention_weights`
(``phrasescore align`` draws and hard-aligns them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from phrasescore.model.base import EncoderDecoder, EncoderOutput, full_lengths, padded_lengths
from phrasescore.model.config import ModelConfig
from phrasescore.model.gru import (
    compiled_step,
    gru_encoder_step,
    run_fused_gru,
    run_gru_encoder,
)
from phrasescore.model.initialization import init_attention
from phrasescore.model.lstm import reverse_within
from phrasescore.model.output_layer import maxout, summed_linear
from phrasescore.special_ids import PAD_ID


def source_mask(src: Tensor, lengths: Tensor | None) -> Tensor:
    """[B, S] True at the real positions of rows of ``lengths`` (None: every row full)."""
    positions = torch.arange(src.shape[1], device=src.device).unsqueeze(0)
    return positions < full_lengths(src, lengths).unsqueeze(1)


class AttentionEncoderDecoder(EncoderDecoder):
    """Bahdanau et al. (2015) RNNsearch: bidirectional GRU encoder, additive attention."""

    POSITIONAL_OUTPUTS = ("ann", "ann_proj", "mask")

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        emb, hid, mx, rank = (
            config.embedding_dim,
            config.hidden_dim,
            config.maxout_units,
            config.output_rank,
        )
        att = hid
        self.src_embed = nn.Embedding(config.src_vocab_size, emb, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, emb, padding_idx=PAD_ID)
        self._build_encoder(emb, hid)
        self.dec_init = nn.Linear(hid, hid)  # W_s: s_0 = tanh(W_s ←h_1)
        # Alignment model e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j).
        self.att_state = nn.Linear(hid, att, bias=False)  # W_a
        self.att_annotation = nn.Linear(2 * hid, att, bias=False)  # U_a
        self.att_v = nn.Linear(att, 1, bias=False)  # v_a
        # Decoder GRU: input [W_r; W_z; W] E y, context [C_r; C_z; C] c, recurrent [U_r U_z], U.
        self.dec_input = nn.Linear(emb, 3 * hid)
        self.dec_context = nn.Linear(2 * hid, 3 * hid, bias=False)
        self.dec_u_rz = nn.Parameter(torch.empty(hid, 2 * hid))
        self.dec_u_h = nn.Parameter(torch.empty(hid, hid))
        # Output t~ = U_o s_i + V_o E y_{i-1} + C_o c_i, maxout, W_o (= G_r G_l when R < l).
        self.out_hidden = nn.Linear(hid, 2 * mx)
        self.out_prev = nn.Linear(emb, 2 * mx, bias=False)
        self.out_context = nn.Linear(2 * hid, 2 * mx, bias=False)
        self.out_rank = nn.Identity() if rank == mx else nn.Linear(mx, rank, bias=False)
        self.out_vocab = nn.Linear(rank, config.tgt_vocab_size)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    def _decoder_step_fn(self):
        return compiled_step(self.decoder_step) if self.compiled else self.decoder_step

    def _encoder_step_fn(self):
        return compiled_step(gru_encoder_step) if self.compiled else gru_encoder_step

    RECURRENT = (
        "enc_fwd_u_rz",
        "enc_fwd_u_h",
        "enc_bwd_u_rz",
        "enc_bwd_u_h",
        "dec_u_rz",
        "dec_u_h",
    )
    """The recurrent matrices, initialised orthogonal (:func:`init_attention`)."""

    def _build_encoder(self, emb: int, hid: int) -> None:
        """The bidirectional encoder's parameters (called between the embeddings and W_s, so
        that the parameters, hence the seeded initial weights, come in one order)."""
        # Encoder: input matrices [W_r; W_z; W] of the forward and then the backward GRU.
        self.enc_input = nn.Linear(emb, 6 * hid)
        self.enc_fwd_u_rz = nn.Parameter(torch.empty(hid, 2 * hid))
        self.enc_fwd_u_h = nn.Parameter(torch.empty(hid, hid))
        self.enc_bwd_u_rz = nn.Parameter(torch.empty(hid, 2 * hid))
        self.enc_bwd_u_h = nn.Parameter(torch.empty(hid, hid))

    def reset_parameters(self) -> None:
        """Bahdanau et al. App. B.1 (see the module docstring)."""
        init_attention(self, self.RECURRENT)

    # ------------------------------------------------------------------------ encoder
    def encode(self, src: Tensor, src_lengths: Tensor | None) -> EncoderOutput:
        """Annotations ``ann`` [B, S, 2H], their projections U_a h_j ``ann_proj`` [B, S, H],
        the source ``mask`` [B, S] (True at real positions) and ``←h_1`` ``first_back`` [B, H].

        Annotations at padded positions are 0 (they get 0 attention weight anyway).
        """
        hid = self.config.hidden_dim
        steps = src.shape[1]
        x_proj = self.enc_input(self.dropout(self.src_embed(src)))
        h0 = x_proj.new_zeros(src.shape[0], hid)
        lengths = padded_lengths(src_lengths, steps)
        padded = lengths is not None
        step = self._encoder_step_fn()
        forward, _ = run_gru_encoder(
            x_proj[..., : 3 * hid], h0, self.enc_fwd_u_rz, self.enc_fwd_u_h, lengths, step=step
        )
        if padded:
            backward, _ = run_gru_encoder(
                reverse_within(x_proj[..., 3 * hid :], src_lengths),
                h0,
                self.enc_bwd_u_rz,
                self.enc_bwd_u_h,
                lengths,
                step=step,
            )
            backward = reverse_within(backward, src_lengths)
        else:
            backward, _ = run_gru_encoder(
                x_proj[..., 3 * hid :].flip(1),
                h0,
                self.enc_bwd_u_rz,
                self.enc_bwd_u_h,
                None,
                step=step,
            )
            backward = backward.flip(1)
        mask = source_mask(src, lengths)
        ann = torch.cat([forward, backward], dim=2)
        if padded:
            ann = ann * mask.unsqueeze(2).to(ann.dtype)
        return {
            "ann": ann,
            "ann_proj": self.att_annotation(ann),
            "mask": mask,
            "first_back": backward[:, 0],
        }

    def summary_vector(self, enc: EncoderOutput) -> Tensor:
        """←h_1, the backward GRU's state after reading the whole source: the fixed-length
        summary from which the decoder starts (s_0 = tanh(W_s ←h_1))."""
        return enc["first_back"]

    # ------------------------------------------------------------------------ attention
    def attend(
        self, s_prev: Tensor, ann: Tensor, ann_proj: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(α_i [B, S], c_i [B, 2H]) for the decoder states s_{i-1} [B, H]."""
        energy = self.att_v(torch.tanh(self.att_state(s_prev).unsqueeze(1) + ann_proj))
        energy = energy.squeeze(2).masked_fill(~mask, float("-inf"))
        alpha = torch.softmax(energy, dim=1)
        context = torch.bmm(alpha.unsqueeze(1).to(ann.dtype), ann).squeeze(1)
        return alpha, context

    # ------------------------------------------------------------------------ decoder
    def start(self, enc: EncoderOutput) -> dict[str, Tensor]:
        return {
            "s": torch.tanh(self.dec_init(enc["first_back"])),
            "ann": enc["ann"],
            "ann_proj": enc["ann_proj"],
            "mask": enc["mask"],
        }

    def _output_features(self, s: Tensor, prev_emb: Tensor, context: Tensor) -> Tensor:
        """G_l maxout(U_o s_i + V_o E y_{i-1} + C_o c_i) (Bahdanau et al. A.2.2)."""
        t = summed_linear(
            [(self.out_hidden, s), (self.out_prev, prev_emb), (self.out_context, context)]
        )
        return self.out_rank(self.dropout(maxout(t)))

    def _run_decoder(
        self, enc: EncoderOutput, tgt_in: Tensor, keep_alpha: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Teacher-forced decoder: (embeddings, states s_i, contexts c_i, α or None)."""
        state = self.start(enc)
        prev_emb = self.dropout(self.tgt_embed(tgt_in))  # [B, T, E]
        x_proj = self.dec_input(prev_emb)  # [B, T, 3H], all steps in one product
        s, ann, ann_proj, mask = state["s"], state["ann"], state["ann_proj"], state["mask"]
        states, contexts, alphas = [], [], []
        step = self._decoder_step_fn()
        # unbind: one backward node for all steps, not a zero-filled [B, T, 3H] gradient each
        for x_i in x_proj.unbind(1):
            s, context, alpha = step(x_i, s, ann, ann_proj, mask)
            states.append(s)
            contexts.append(context)
            if keep_alpha:
                alphas.append(alpha)
        stacked_alpha = torch.stack(alphas, dim=1) if keep_alpha else None
        return prev_emb, torch.stack(states, dim=1), torch.stack(contexts, dim=1), stacked_alpha

    def decoder_step(
        self, x_i: Tensor, s: Tensor, ann: Tensor, ann_proj: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One teacher-forced decoder step (A.1.2 and A.2.2): (s_i, c_i, α_i) from the input
        terms ``x_i`` = [W_r; W_z; W] E y_{i-1} (+ biases) and s_{i-1}: the alignment, the
        context, then the GRU of eq. 5-8 with C c_i added to its input terms. One function, so
        that ``train --compile`` compiles it whole (:meth:`compile_steps`)."""
        alpha, context = self.attend(s, ann, ann_proj, mask)
        s = gru_encoder_step(x_i + self.dec_context(context), s, self.dec_u_rz, self.dec_u_h)
        return s, context, alpha

    def decode_features(self, enc: EncoderOutput, tgt_in: Tensor) -> Tensor:
        prev_emb, states, contexts, _ = self._run_decoder(enc, tgt_in, keep_alpha=False)
        return self._output_features(states, prev_emb, contexts)

    def attention_weights(self, enc: EncoderOutput, tgt_in: Tensor) -> Tensor:
        """α [B, T, S]: row i holds the weights used to predict the target token after
        ``tgt_in[:, i]`` (i.e. ``tgt_out[:, i]``); 0 at padded source positions."""
        return self._run_decoder(enc, tgt_in, keep_alpha=True)[3]

    def step(self, state: dict[str, Tensor], prev: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        prev_emb = self.tgt_embed(prev)
        _, context = self.attend(state["s"], state["ann"], state["ann_proj"], state["mask"])
        x_proj = self.dec_input(prev_emb) + self.dec_context(context)
        s = gru_encoder_step(x_proj, state["s"], self.dec_u_rz, self.dec_u_h)
        features = self._output_features(s, prev_emb, context)
        return features, {**state, "s": s}

    def scoring_flops(self, src_len: float, tgt_len: float, share: float = 1.0) -> float:
        """Floating-point operations (2 per multiply-add) to score one pair teacher-forced.

        Per source token: two GRUs and U_a h_j; per target token: W_a s, the alignment scores
        and context over all ``src_len`` positions, the decoder GRU with its context input, the
        maxout output and the vocabulary projection. Arguments as for the Cho model.
        """
        cfg = self.config
        emb, hid, mx, rank, vocab = (
            cfg.embedding_dim,
            cfg.hidden_dim,
            cfg.maxout_units,
            cfg.output_rank,
            cfg.tgt_vocab_size,
        )
        att = hid
        per_src_token = 2 * (3 * hid * emb + 3 * hid * hid) + att * 2 * hid
        per_pair = hid * hid  # s_0 = tanh(W_s ←h_1)
        per_tgt_token = att * hid + src_len * (att + 2 * hid)  # W_a s, v_aᵀ tanh(.), Σ α h
        per_tgt_token += 3 * hid * emb + 3 * hid * hid + 3 * hid * 2 * hid  # GRU with C c_i
        per_tgt_token += 2 * mx * (hid + emb + 2 * hid)  # U_o s, V_o E y, C_o c
        per_tgt_token += (0 if rank == mx else mx * rank) + rank * vocab
        macs = share * src_len * per_src_token + per_pair + tgt_len * per_tgt_token
        return 2.0 * macs


class FusedAttentionEncoderDecoder(AttentionEncoderDecoder):
    """RNNsearch with the bidirectional :class:`torch.nn.GRU` encoder (cuDNN's formulation):
    ``recurrence="fused"``; the attention and the decoder are :class:`AttentionEncoderDecoder`'s."""

    RECURRENT = (
        "encoder.weight_hh_l0",
        "encoder.weight_hh_l0_reverse",
        "dec_u_rz",
        "dec_u_h",
    )

    def _build_encoder(self, emb: int, hid: int) -> None:
        # torch.nn.GRU, both directions, cuDNN's formulation (gru.py)
        self.encoder = nn.GRU(emb, hid, batch_first=True, bidirectional=True)

    def encode(self, src: Tensor, src_lengths: Tensor | None) -> EncoderOutput:
        """:meth:`AttentionEncoderDecoder.encode` with the bidirectional :class:`torch.nn.GRU`:
        its outputs are the annotations [→h_j; ←h_j] (0 at padded positions), its backward final
        state ←h_1."""
        lengths = padded_lengths(src_lengths, src.shape[1])
        ann, last = run_fused_gru(self.encoder, self.dropout(self.src_embed(src)), lengths)
        return {
            "ann": ann,
            "ann_proj": self.att_annotation(ann),
            "mask": source_mask(src, lengths),
            "first_back": last[1],
        }
