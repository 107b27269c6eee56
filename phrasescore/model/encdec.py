"""The RNN Encoder-Decoder of Cho et al. (2014), §2.2 and Appendix A.

Encoder (§2.2, A.1.1): a GRU (eq. 5-8) over the source embeddings e(x_t); its last state gives the
summary ``c = tanh(V h_T)``.

Decoder (A.1.1): initial state ``h'_0 = tanh(V' c)``; each step sees the previous word and c::

    r', z' = σ(W e(y_{t-1}) + U h'_{t-1} + C c)
    h~'    = tanh(W e(y_{t-1}) + r' ⊙ (U h'_{t-1} + C c))
    h'_t   = z' ⊙ h'_{t-1} + (1 - z') ⊙ h~'

With ``recurrence="fused"`` (issue 39; not in ``--preset paper``) both GRUs are
:class:`torch.nn.GRU`, cuDNN's formulation (:mod:`phrasescore.model.gru`): the encoder over packed
sequences, its candidate ``tanh(W x + b + r ⊙ (U h + b_h))`` instead of eq. 8's
``tanh(W x + U (r ⊙ h))``; the decoder fed ``[e(y_{t-1}); c]`` each step, which gives the gates
``σ(W e + C c + U h' + b)`` as above but the candidate ``tanh(W e + C c + b + r' ⊙ (U h' + b_h))``,
C c outside the reset gate instead of inside it. Everything else (c, h'_0, the output layer) is
the same.

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

from phrasescore.model.base import EncoderDecoder, EncoderOutput
from phrasescore.model.config import ModelConfig
from phrasescore.model.constants import PAD_ID
from phrasescore.model.gru import (
    gru_decoder_step,
    run_fused_gru,
    run_gru_decoder,
    run_gru_encoder,
)
from phrasescore.model.initialization import init_cho
from phrasescore.model.output_layer import maxout, summed_linear


class GRUEncoderDecoder(EncoderDecoder):
    """Cho et al. (2014) RNN Encoder-Decoder with GRUs and a maxout output layer."""

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
        self.fused = config.recurrence == "fused"
        if self.fused:  # torch.nn.GRU, cuDNN's formulation (gru.py)
            self.encoder = nn.GRU(emb, hid, batch_first=True)
        else:
            # Encoder GRU: input matrices [W_r; W_z; W] (with biases) and recurrent U_r, U_z, U.
            self.enc_input = nn.Linear(emb, 3 * hid)
            self.enc_u_rz = nn.Parameter(torch.empty(hid, 2 * hid))
            self.enc_u_h = nn.Parameter(torch.empty(hid, hid))
        self.summary = nn.Linear(hid, hid)  # V: c = tanh(V h_T)
        self.dec_init = nn.Linear(hid, hid)  # V': h'_0 = tanh(V' c)
        if self.fused:  # torch.nn.GRU over [e(y_{t-1}); c]: C c outside the reset gate
            self.decoder = nn.GRU(emb + hid, hid, batch_first=True)
        else:
            # Decoder GRU: input [W_r; W_z; W], recurrent [U_r U_z U], summary [C_r; C_z; C].
            self.dec_input = nn.Linear(emb, 3 * hid)
            self.dec_u = nn.Parameter(torch.empty(hid, 3 * hid))
            self.dec_context = nn.Linear(hid, 3 * hid, bias=False)
        # Output layer s_t = O_h h'_t + O_y e(y_{t-1}) + O_c c, maxout, low-rank G_r G_l.
        self.out_hidden = nn.Linear(hid, 2 * mx)
        self.out_prev = nn.Linear(emb, 2 * mx, bias=False)
        self.out_context = nn.Linear(hid, 2 * mx, bias=False)
        self.out_rank = nn.Linear(mx, rank, bias=False)  # G_l
        self.out_vocab = nn.Linear(rank, config.tgt_vocab_size)  # G_r (+ bias)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    RECURRENT = ("enc_u_rz", "enc_u_h", "dec_u")
    FUSED_RECURRENT = ("encoder.weight_hh_l0", "decoder.weight_hh_l0")

    def reset_parameters(self) -> None:
        """N(0, 0.01²) weights, orthogonal recurrent matrices, zero biases (Cho et al. §4.1), or
        the fan-in scales of the default preset (:func:`init_cho`)."""
        init_cho(self, self.FUSED_RECURRENT if self.fused else self.RECURRENT)

    # ------------------------------------------------------------------------ encoder
    def encode(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        """c = tanh(V h_T) for each source (h_T: the GRU state after its last real token)."""
        if self.fused:
            _, last = run_fused_gru(self.encoder, self.dropout(self.src_embed(src)), src_lengths)
            return {"c": torch.tanh(self.summary(last[0]))}
        x_proj = self.enc_input(self.dropout(self.src_embed(src)))
        h0 = x_proj.new_zeros(src.shape[0], self.config.hidden_dim)
        padded = bool((src_lengths != src.shape[1]).any())
        _, last = run_gru_encoder(
            x_proj,
            h0,
            self.enc_u_rz,
            self.enc_u_h,
            src_lengths if padded else None,
            keep_states=False,  # only h_T is used
        )
        return {"c": torch.tanh(self.summary(last))}

    def summary_vector(self, enc: EncoderOutput) -> Tensor:
        return enc["c"]

    # ------------------------------------------------------------------------ decoder
    def source_terms(self, enc: EncoderOutput) -> EncoderOutput:
        """V'c, C c and O_c c: once per distinct source (scoring, beam search), not per pair
        (``recurrence="fused"``: C c is the decoder GRU's own, computed each step)."""
        c = enc["c"]
        terms = {"h0": torch.tanh(self.dec_init(c)), "ctx_out": self.out_context(c)}
        if not self.fused:
            terms["ctx_gates"] = self.dec_context(c)
        return terms

    def start(self, enc: EncoderOutput) -> dict[str, Tensor]:
        terms = enc if "h0" in enc else self.source_terms(enc)
        if self.fused:
            return {"h": terms["h0"], "c": enc["c"], "ctx_out": terms["ctx_out"]}
        return {"h": terms["h0"], "ctx_gates": terms["ctx_gates"], "ctx_out": terms["ctx_out"]}

    def _output_features(self, h: Tensor, prev_emb: Tensor, ctx_out: Tensor) -> Tensor:
        """G_l maxout(O_h h' + O_y e(y_{t-1}) + O_c c) (Cho et al. A.1.2)."""
        s = summed_linear([(self.out_hidden, h), (self.out_prev, prev_emb)], ctx_out)
        return self.out_rank(self.dropout(maxout(s)))

    def decode_features(self, enc: EncoderOutput, tgt_in: Tensor) -> Tensor:
        state = self.start(enc)
        prev_emb = self.dropout(self.tgt_embed(tgt_in))  # [B, T, E]
        if self.fused:  # one torch.nn.GRU call over [e(y_{t-1}); c] for all steps
            c = state["c"].unsqueeze(1).expand(-1, tgt_in.shape[1], -1)
            h0 = state["h"].unsqueeze(0).contiguous()
            hidden, _ = self.decoder(torch.cat([prev_emb, c.to(prev_emb.dtype)], dim=2), h0)
            return self._output_features(hidden, prev_emb, state["ctx_out"].unsqueeze(1))
        x_proj = self.dec_input(prev_emb)  # [B, T, 3H], all steps in one product
        hidden = run_gru_decoder(x_proj, state["h"], self.dec_u, state["ctx_gates"])
        return self._output_features(hidden, prev_emb, state["ctx_out"].unsqueeze(1))

    def step(self, state: dict[str, Tensor], prev: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        prev_emb = self.tgt_embed(prev)
        if self.fused:
            x = torch.cat([prev_emb, state["c"].to(prev_emb.dtype)], dim=1).unsqueeze(1)
            _, h = self.decoder(x, state["h"].unsqueeze(0).contiguous())
            features = self._output_features(h[0], prev_emb, state["ctx_out"])
            return features, {**state, "h": h[0]}
        h = gru_decoder_step(self.dec_input(prev_emb), state["h"], self.dec_u, state["ctx_gates"])
        features = self._output_features(h, prev_emb, state["ctx_out"])
        return features, {**state, "h": h}

    def logits(self, features: Tensor) -> Tensor:
        return self.out_vocab(features)

    def scoring_flops(self, src_len: float, tgt_len: float, share: float = 1.0) -> float:
        """Floating-point operations (2 per multiply-add) to score one pair teacher-forced.

        ``src_len``/``tgt_len`` count tokens with EOS; ``share`` is the fraction of pairs whose
        source is encoded (1 / targets per source when encodings are shared). SPEC §5.
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
        if self.fused:  # the decoder GRU's input is [e(y); c]: C c for every target token
            per_pair -= 3 * hid * hid
            per_tgt_token += 3 * hid * hid
        macs = share * (src_len * per_src_token + per_source) + per_pair + tgt_len * per_tgt_token
        return 2.0 * macs
