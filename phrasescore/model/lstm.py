"""The deep LSTM sequence-to-sequence model of Sutskever et al. (2014), §2-3.4.

Two different LSTMs, each a stack of ``layers`` layers of H cells (4 x 1000 in the paper): the
encoder reads the source, the decoder generates the target. Each layer is the LSTM of Graves
(2013), as cited by the paper (§2)::

    i_t = σ(W_i x_t + U_i h_{t-1} + b_i)        input gate
    f_t = σ(W_f x_t + U_f h_{t-1} + b_f)        forget gate
    g_t = tanh(W_g x_t + U_g h_{t-1} + b_g)     cell input
    o_t = σ(W_o x_t + U_o h_{t-1} + b_o)        output gate
    c_t = f_t ⊙ c_{t-1} + i_t ⊙ g_t
    h_t = o_t ⊙ tanh(c_t)

x_t is the word embedding for the first layer and the state h_t of the layer below for the others
(Graves 2013 writes peephole terms; Sutskever et al. do not use them). The layers are
:class:`torch.nn.LSTM` (cuDNN on CUDA, oneDNN on CPU). **Bias note:** PyTorch's LSTM has two bias
vectors, ``b_ih`` and ``b_hh``, where the equations have one; their sum is that bias, so the
function class is the same (only the initial distribution of the effective bias differs: the sum
of two U(±a) draws).

Source reversal (§3.3): "we reversed the order of the words in all source sentences, but not the
target sentences". It happens inside :meth:`DeepLSTMEncoderDecoder.encode` (the model's input
preparation), so every caller -- training, scoring of phrase tables and n-best lists, beam search
-- gives sources in their natural order and never reverses a file. Rows arrive as
``x_1 .. x_n EOS PAD ..`` (``src_lengths`` counts the EOS); the *words* are reversed and EOS stays
last: the encoder reads ``x_n .. x_1 EOS``, as in the paper's Figure 1, where the input sequence
is followed by ``<EOS>`` and then the output begins. Padding stays at the end of each row.
``reverse_source=False`` (``train --no-reverse``) reads ``x_1 .. x_n EOS``.

Decoder: the last encoder states (h and c of every layer, after EOS) are the decoder's initial
states (§2: "the LSTM computes the representation of this input sequence ... and then computes
the probability of y_1..y_T' with a standard LSTM-LM formulation whose initial hidden state is set
to the representation v"). The output is a softmax over the top layer's state:
``p(y_t | y_<t, x) = softmax(W h^L_t)``. Here ``W = G_r G_l`` when ``output_rank`` R is smaller
than H (a low-rank factorisation as in Cho et al.'s output layer; ``features`` are ``G_l h^L_t``)
and the full ``W`` (``features = h^L_t``) when R equals H, as in ``--preset paper``.

Initialisation (§3.4): "all of the LSTM's parameters with the uniform distribution between -0.08
and 0.08" (``init_uniform``; here every parameter: embeddings, LSTMs, output layer); with
``init_uniform=None``: N(0, ``init_std``²) weights and zero biases; the default preset starts
from PyTorch's fan-in scales (``init="fan_in"``, :func:`~phrasescore.model.initialization.init_fan_in`). Dropout (default preset only;
Sutskever et al. use none) is applied to the embeddings, between layers (Zaremba et al. 2014) and
to the top layer's output.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from phrasescore.model.base import EncoderDecoder, EncoderOutput, full_lengths, padded_lengths
from phrasescore.model.config import ModelConfig
from phrasescore.model.initialization import init_lstm
from phrasescore.special_ids import PAD_ID


def reverse_within(x: Tensor, lengths: Tensor) -> Tensor:
    """Reverse the first ``lengths[b]`` entries of each row ``b`` along dim 1; the rest stays.

    ``x`` is [B, S] or [B, S, ...]. The map is its own inverse.
    """
    steps = x.shape[1]
    t = torch.arange(steps, device=x.device).unsqueeze(0)
    n = lengths.to(x.device).unsqueeze(1)
    index = torch.where(t < n, n - 1 - t, t)
    if x.dim() > 2:
        index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


class DeepLSTMEncoderDecoder(EncoderDecoder):
    """Sutskever et al. (2014): deep LSTM encoder and decoder, source reversed."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        emb, hid, rank, layers = (
            config.embedding_dim,
            config.hidden_dim,
            config.output_rank,
            config.layers,
        )
        if layers < 1:
            raise ValueError(f"an LSTM needs at least one layer, got {layers}")
        self.src_embed = nn.Embedding(config.src_vocab_size, emb, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, emb, padding_idx=PAD_ID)
        between = config.dropout if layers > 1 else 0.0
        self.encoder = nn.LSTM(emb, hid, num_layers=layers, batch_first=True, dropout=between)
        self.decoder = nn.LSTM(emb, hid, num_layers=layers, batch_first=True, dropout=between)
        # softmax(W h^L): W = G_r G_l (rank R < H) or W itself (R = H)
        self.out_rank = nn.Identity() if rank == hid else nn.Linear(hid, rank, bias=False)
        self.out_vocab = nn.Linear(rank, config.tgt_vocab_size)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """U(±init_uniform) for every parameter (Sutskever et al. §3.4), else N(0, init_std²)
        weights and zero biases."""
        init_lstm(self)

    # ------------------------------------------------------------------------ encoder
    def prepare_source(self, src: Tensor, src_lengths: Tensor | None) -> Tensor:
        """The order the encoder reads: words reversed, EOS kept last (``reverse_source``)."""
        if not self.config.reverse_source:
            return src
        return reverse_within(src, full_lengths(src, src_lengths) - 1)

    def encode(self, src: Tensor, src_lengths: Tensor | None) -> EncoderOutput:
        """h and c of every encoder layer after the last real token (EOS): ``[B, layers, H]``."""
        x = self.dropout(self.src_embed(self.prepare_source(src, src_lengths)))
        lengths = padded_lengths(src_lengths, src.shape[1])
        if lengths is not None:
            x = nn.utils.rnn.pack_padded_sequence(
                x, lengths.cpu(), batch_first=True, enforce_sorted=False
            )
        _, (h, c) = self.encoder(x)
        return {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}

    def summary_vector(self, enc: EncoderOutput) -> Tensor:
        """The top layer's last encoder state h^L (Sutskever et al. Fig. 2 projects exactly
        these "LSTM hidden states that are obtained after processing the phrases")."""
        return enc["h"][:, -1]

    # ------------------------------------------------------------------------ decoder
    def start(self, enc: EncoderOutput) -> dict[str, Tensor]:
        """The decoder starts from the encoder's last (h, c) of every layer."""
        return {"h": enc["h"], "c": enc["c"]}

    @staticmethod
    def _layers_first(state: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return state["h"].transpose(0, 1).contiguous(), state["c"].transpose(0, 1).contiguous()

    def _output_features(self, top: Tensor) -> Tensor:
        return self.out_rank(self.dropout(top))

    def decode_features(self, enc: EncoderOutput, tgt_in: Tensor) -> Tensor:
        x = self.dropout(self.tgt_embed(tgt_in))
        top, _ = self.decoder(x, self._layers_first(enc))
        return self._output_features(top)

    def step(self, state: dict[str, Tensor], prev: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        x = self.tgt_embed(prev).unsqueeze(1)
        top, (h, c) = self.decoder(x, self._layers_first(state))
        features = self._output_features(top[:, 0])
        return features, {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}

    def scoring_flops(self, src_len: float, tgt_len: float, share: float = 1.0) -> float:
        """Floating-point operations (2 per multiply-add) to score one pair teacher-forced.

        Per token and layer an LSTM does 4H x (input + H) multiply-adds (the input is E wide for
        the first layer, H for the others); each target token adds the output layer. Arguments
        as for the Cho model (``share``: fraction of pairs whose source is encoded).
        """
        cfg = self.config
        emb, hid, rank, vocab, layers = (
            cfg.embedding_dim,
            cfg.hidden_dim,
            cfg.output_rank,
            cfg.tgt_vocab_size,
            cfg.layers,
        )
        per_token = 4 * hid * (emb + hid) + (layers - 1) * 4 * hid * (2 * hid)
        per_tgt_token = per_token + (0 if rank == hid else hid * rank) + rank * vocab
        macs = share * src_len * per_token + tgt_len * per_tgt_token
        return 2.0 * macs
