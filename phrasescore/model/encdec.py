"""The RNN Encoder-Decoder of Cho et al. (2014), §2.2 and Appendix A.

Encoder (§2.2, A.1.1): a GRU (eq. 5-8) over the source embeddings e(x_t); its last state gives the
summary ``c = tanh(V h_T)``.

Decoder (A.1.1): initial state ``h'_0 = tanh(V' c)``; each step sees the previous word and c::

    r', z' = σ(W e(y_{t-1}) + U h'_{t-1} + C c)
    h~'    = tanh(W e(y_{t-1}) + r' ⊙ (U h'_{t-1} + C c))
    h'_t   = z' ⊙ h'_{t-1} + (1 - z') ⊙ h~'

Two networks, one per recurrence (``ModelConfig.recurrence``; :mod:`phrasescore.model.builders`
picks the class), share everything but their two GRUs (:class:`ChoEncoderDecoder`):

* :class:`GRUEncoderDecoder` (``"written"``, every preset): both GRUs written out, the encoder
  eq. 5-8 and the decoder above (:mod:`phrasescore.model.gru`);
* :class:`FusedGRUEncoderDecoder` (``"fused"``; not in ``--preset paper``): both GRUs are
  :class:`torch.nn.GRU`, cuDNN's formulation (:mod:`phrasescore.model.gru`): the encoder over
  packed sequences, its candidate ``tanh(W x + b + r ⊙ (U h + b_h))`` instead of eq. 8's
  ``tanh(W x + U (r ⊙ h))``; the decoder fed ``[e(y_{t-1}); c]`` each step, which gives the gates
  ``σ(W e + C c + U h' + b)`` as above but the candidate ``tanh(W e + C c + b + r' ⊙ (U h' +
  b_h))``, C c outside the reset gate instead of inside it. Everything else (c, h'_0, the output
  layer) is the same.

Output (A.1.2): ``s_t = O_h h'_t + O_y e(y_{t-1}) + O_c c`` (2M units), maxout with pools of 2 to M
units, then the low-rank output matrix ``G = G_r G_l`` (rank R, the embedding size in the paper)
and a softmax over the target vocabulary: ``p(y_t | y_<t, c) ∝ exp(G_r G_l maxout(s_t))``.

Embeddings are low rank in the same sense (R-dimensional word vectors feeding 3H-wide input
matrices). Initialisation (§4.1, A.1; ``--preset paper``): weights N(0, 0.01²), recurrent matrices
orthogonal, biases 0; the default preset: PyTorch's fan-in scales, recurrent matrices orthogonal.
Dropout (default preset only; 0 in ``--preset paper``) is applied to embeddings and maxout units.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from phrasescore.model.base import EncoderDecoder, EncoderOutput, padded_lengths
from phrasescore.model.config import ModelConfig
from phrasescore.model.gru import (
    compiled_step,
    gru_decoder_loop_step,
    gru_decoder_step,
    gru_encoder_step,
    run_fused_gru,
    run_gru_decoder,
    run_gru_encoder,
)
from phrasescore.model.initialization import init_cho
from phrasescore.model.output_layer import maxout, summed_linear
from phrasescore.special_ids import PAD_ID


class ChoEncoderDecoder(EncoderDecoder):
    """What both recurrences of the Cho et al. (2014) encoder-decoder share: the embeddings,
    ``c = tanh(V h_T)``, ``h'_0 = tanh(V' c)`` and the maxout output layer (A.1.2).

    A subclass builds and runs the two GRUs: :meth:`_build_encoder`, :meth:`_build_decoder`
    (called in this order between the shared layers, so that the parameters, hence the seeded
    initial weights, come in one order), :meth:`_last_state` (h_T), :meth:`start`,
    :meth:`_decoder_states` (teacher-forced h'_t) and :meth:`_decoder_step` (one h'_t).
    """

    RECURRENT: tuple[str, ...] = ()
    """The recurrent matrices, initialised orthogonal (:func:`init_cho`)."""
    CONTEXT_EACH_STEP = False
    """Whether the decoder GRU computes C c in every step (its input is ``[e(y_{t-1}); c]``)
    rather than once per pair: :meth:`scoring_flops`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        emb, hid, mx, rank = (
            config.embedding_dim,
            config.hidden_dim,
            config.maxout_units,
            config.output_rank,
        )
        self.src_embed = nn.Embedding(config.src_vocab_size, emb, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, emb, padding_idx=PAD_ID)
        self._build_encoder(emb, hid)
        self.summary = nn.Linear(hid, hid)  # V: c = tanh(V h_T)
        self.dec_init = nn.Linear(hid, hid)  # V': h'_0 = tanh(V' c)
        self._build_decoder(emb, hid)
        # Output layer s_t = O_h h'_t + O_y e(y_{t-1}) + O_c c, maxout, low-rank G_r G_l.
        self.out_hidden = nn.Linear(hid, 2 * mx)
        self.out_prev = nn.Linear(emb, 2 * mx, bias=False)
        self.out_context = nn.Linear(hid, 2 * mx, bias=False)
        self.out_rank = nn.Linear(mx, rank, bias=False)  # G_l
        self.out_vocab = nn.Linear(rank, config.tgt_vocab_size)  # G_r (+ bias)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    def _build_encoder(self, emb: int, hid: int) -> None:
        raise NotImplementedError

    def _build_decoder(self, emb: int, hid: int) -> None:
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """N(0, 0.01²) weights, orthogonal recurrent matrices, zero biases (Cho et al. §4.1), or
        the fan-in scales of the default preset (:func:`init_cho`)."""
        init_cho(self, self.RECURRENT)

    # ------------------------------------------------------------------------ encoder
    def encode(self, src: Tensor, src_lengths: Tensor | None) -> EncoderOutput:
        """c = tanh(V h_T) for each source (h_T: the GRU state after its last real token)."""
        last = self._last_state(self.dropout(self.src_embed(src)), src_lengths)
        return {"c": torch.tanh(self.summary(last))}

    def _last_state(self, x: Tensor, src_lengths: Tensor | None) -> Tensor:
        """h_T [B, H] of the encoder GRU over the embedded sources ``x`` [B, S, E]."""
        raise NotImplementedError

    def summary_vector(self, enc: EncoderOutput) -> Tensor:
        return enc["c"]

    # ------------------------------------------------------------------------ decoder
    def source_terms(self, enc: EncoderOutput) -> EncoderOutput:
        """V'c and O_c c: once per distinct source (scoring, beam search), not per pair."""
        c = enc["c"]
        return {"h0": torch.tanh(self.dec_init(c)), "ctx_out": self.out_context(c)}

    def _terms(self, enc: EncoderOutput) -> EncoderOutput:
        """The source terms, from ``enc`` when they were added to it, else computed."""
        return enc if "h0" in enc else self.source_terms(enc)

    def _output_features(self, h: Tensor, prev_emb: Tensor, ctx_out: Tensor) -> Tensor:
        """G_l maxout(O_h h' + O_y e(y_{t-1}) + O_c c) (Cho et al. A.1.2)."""
        s = summed_linear([(self.out_hidden, h), (self.out_prev, prev_emb)], ctx_out)
        return self.out_rank(self.dropout(maxout(s)))

    def decode_features(self, enc: EncoderOutput, tgt_in: Tensor) -> Tensor:
        state = self.start(enc)
        prev_emb = self.dropout(self.tgt_embed(tgt_in))  # [B, T, E]
        hidden = self._decoder_states(state, prev_emb)
        return self._output_features(hidden, prev_emb, state["ctx_out"].unsqueeze(1))

    def _decoder_states(self, state: dict[str, Tensor], prev_emb: Tensor) -> Tensor:
        """h'_1 .. h'_T [B, T, H], teacher-forced from :meth:`start`'s ``state``."""
        raise NotImplementedError

    def step(self, state: dict[str, Tensor], prev: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        prev_emb = self.tgt_embed(prev)
        h = self._decoder_step(state, prev_emb)
        features = self._output_features(h, prev_emb, state["ctx_out"])
        return features, {**state, "h": h}

    def _decoder_step(self, state: dict[str, Tensor], prev_emb: Tensor) -> Tensor:
        """h'_t [B, H] from ``state["h"]`` = h'_{t-1} and e(y_{t-1}) ``prev_emb`` [B, E]."""
        raise NotImplementedError

    def scoring_flops(self, src_len: float, tgt_len: float, share: float = 1.0) -> float:
        """Floating-point operations (2 per multiply-add) to score one pair teacher-forced.

        ``src_len``/``tgt_len`` count tokens with EOS; ``share`` is the fraction of pairs whose
        source is encoded (1 / targets per source when encodings are shared). Used for the % of
        the matrix rate in docs/benchmarks.md ("Rescoring engine").
        """
        cfg = self.config
        emb, hid, mx, rank, vocab = (
            cfg.embedding_dim,
            cfg.hidden_dim,
            cfg.maxout_units,
            cfg.output_rank,
            cfg.tgt_vocab_size,
        )
        per_src_token = 3 * hid * emb + 3 * hid * hid
        per_source = hid * hid  # c = tanh(V h_T)
        per_pair = hid * hid + 3 * hid * hid + 2 * mx * hid  # V' c, C c, O_c c
        per_tgt_token = 3 * hid * emb + 3 * hid * hid + 2 * mx * (hid + emb) + mx * rank
        per_tgt_token += rank * vocab
        if self.CONTEXT_EACH_STEP:  # the decoder GRU's input is [e(y); c]: C c every token
            per_pair -= 3 * hid * hid
            per_tgt_token += 3 * hid * hid
        macs = share * (src_len * per_src_token + per_source) + per_pair + tgt_len * per_tgt_token
        return 2.0 * macs


class GRUEncoderDecoder(ChoEncoderDecoder):
    """Cho et al. (2014) RNN Encoder-Decoder with GRUs written out (eq. 5-8; the decoder of
    A.1.1) and a maxout output layer: ``recurrence="written"``, every preset."""

    RECURRENT = ("enc_u_rz", "enc_u_h", "dec_u")

    def _build_encoder(self, emb: int, hid: int) -> None:
        # Encoder GRU: input matrices [W_r; W_z; W] (with biases) and recurrent U_r, U_z, U.
        self.enc_input = nn.Linear(emb, 3 * hid)
        self.enc_u_rz = nn.Parameter(torch.empty(hid, 2 * hid))
        self.enc_u_h = nn.Parameter(torch.empty(hid, hid))

    def _build_decoder(self, emb: int, hid: int) -> None:
        # Decoder GRU: input [W_r; W_z; W], recurrent [U_r U_z U], summary [C_r; C_z; C].
        self.dec_input = nn.Linear(emb, 3 * hid)
        self.dec_u = nn.Parameter(torch.empty(hid, 3 * hid))
        self.dec_context = nn.Linear(hid, 3 * hid, bias=False)

    def _last_state(self, x: Tensor, src_lengths: Tensor | None) -> Tensor:
        """Eq. 5-8 over the sources (:func:`run_gru_encoder`; lengths only for padded rows)."""
        x_proj = self.enc_input(x)
        h0 = x_proj.new_zeros(x.shape[0], self.config.hidden_dim)
        _, last = run_gru_encoder(
            x_proj,
            h0,
            self.enc_u_rz,
            self.enc_u_h,
            padded_lengths(src_lengths, x.shape[1]),
            keep_states=False,  # only h_T is used
            step=compiled_step(gru_encoder_step) if self.compiled else gru_encoder_step,
        )
        return last

    def source_terms(self, enc: EncoderOutput) -> EncoderOutput:
        """V'c, C c and O_c c: once per distinct source (scoring, beam search), not per pair."""
        terms = super().source_terms(enc)
        terms["ctx_gates"] = self.dec_context(enc["c"])
        return terms

    def start(self, enc: EncoderOutput) -> dict[str, Tensor]:
        terms = self._terms(enc)
        return {"h": terms["h0"], "ctx_gates": terms["ctx_gates"], "ctx_out": terms["ctx_out"]}

    def _decoder_states(self, state: dict[str, Tensor], prev_emb: Tensor) -> Tensor:
        """A.1.1's decoder over all steps; the input products W e(y_{t-1}) in one product."""
        x_proj = self.dec_input(prev_emb)  # [B, T, 3H]
        step = compiled_step(gru_decoder_loop_step) if self.compiled else None
        return run_gru_decoder(x_proj, state["h"], self.dec_u, state["ctx_gates"], step=step)

    def _decoder_step(self, state: dict[str, Tensor], prev_emb: Tensor) -> Tensor:
        return gru_decoder_step(
            self.dec_input(prev_emb), state["h"], self.dec_u, state["ctx_gates"]
        )


class FusedGRUEncoderDecoder(ChoEncoderDecoder):
    """The same encoder-decoder with :class:`torch.nn.GRU` (cuDNN's formulation) for both GRUs:
    ``recurrence="fused"`` (see the module docstring for how its candidates differ)."""

    RECURRENT = ("encoder.weight_hh_l0", "decoder.weight_hh_l0")
    CONTEXT_EACH_STEP = True

    def _build_encoder(self, emb: int, hid: int) -> None:
        self.encoder = nn.GRU(emb, hid, batch_first=True)

    def _build_decoder(self, emb: int, hid: int) -> None:
        # torch.nn.GRU over [e(y_{t-1}); c]: C c outside the reset gate
        self.decoder = nn.GRU(emb + hid, hid, batch_first=True)

    def _last_state(self, x: Tensor, src_lengths: Tensor | None) -> Tensor:
        """cuDNN's GRU over the packed sources (:func:`run_fused_gru`)."""
        _, last = run_fused_gru(self.encoder, x, padded_lengths(src_lengths, x.shape[1]))
        return last[0]

    def start(self, enc: EncoderOutput) -> dict[str, Tensor]:
        """h'_0, O_c c and c itself, which the decoder GRU reads in every step."""
        terms = self._terms(enc)
        return {"h": terms["h0"], "c": enc["c"], "ctx_out": terms["ctx_out"]}

    def _decoder_states(self, state: dict[str, Tensor], prev_emb: Tensor) -> Tensor:
        """One :class:`torch.nn.GRU` call over ``[e(y_{t-1}); c]`` for all steps."""
        c = state["c"].unsqueeze(1).expand(-1, prev_emb.shape[1], -1)
        h0 = state["h"].unsqueeze(0).contiguous()
        hidden, _ = self.decoder(torch.cat([prev_emb, c.to(prev_emb.dtype)], dim=2), h0)
        return hidden

    def _decoder_step(self, state: dict[str, Tensor], prev_emb: Tensor) -> Tensor:
        x = torch.cat([prev_emb, state["c"].to(prev_emb.dtype)], dim=1).unsqueeze(1)
        _, h = self.decoder(x, state["h"].unsqueeze(0).contiguous())
        return h[0]
