"""The Transformer encoder-decoder of Vaswani et al. (2017), "Attention Is All You Need", §3: a
sentence model for n-best re-ranking beside the recurrent ones, every position of a sentence
computed at once.

Embeddings (§3.4) scaled by √d (d = ``hidden_dim``) plus sinusoidal positions (§3.5)::

    PE(pos, 2i) = sin(pos / 10000^(2i/d))      PE(pos, 2i+1) = cos(pos / 10000^(2i/d))

Attention (§3.2, eq. 1), in ``heads`` heads of d / heads units (§3.2.2)::

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

The encoder: ``layers`` layers of self-attention and the position-wise feed-forward network
FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2, ``feedforward_dim`` units). The decoder:
``layers`` layers of masked self-attention (position i attends to positions <= i, so that
p(y_i | y_<i, x) reads no later word), attention over the encoder's output and the same FFN.
Padded source positions get no attention weight, so a source scores the same alone or in a
padded batch.

Each sublayer is x + Dropout(Sublayer(LayerNorm(x))), with a LayerNorm after the last layer of
each stack: the pre-norm placement (Wang et al. 2019, "Learning Deep Transformer Models for
Machine Translation"; Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture") instead of the paper's LayerNorm(x + Sublayer(x)). Pre-norm trains without the
paper's learning-rate warm-up, and phrasescore's trainer has none (Adam, reduce on plateau);
the paper's training (warm-up, label smoothing, Adam β2 0.98) is not phrasescore's, so this
architecture has no ``paper`` preset. The layers are written out here (as
:class:`torch.nn.TransformerEncoderLayer` with ``norm_first=True`` computes them, without its
inference fast path, which ignores autocast on the CPU); the scaled dot products are PyTorch's
``scaled_dot_product_attention``: fused kernels on a GPU.

Output: ``features`` = the decoder stack's normalised output [B, T, d] (times G_l [d -> R] when
``output_rank`` R < d), logits = W f + b (``out_vocab``), p(y_i | y_<i, x) = softmax(logits).

Generation and scoring by shared prefixes (:meth:`TransformerEncoderDecoder.step`) keep each
layer's keys and values of the words so far in the state (a key/value cache; the source's
computed once in :meth:`~TransformerEncoderDecoder.start`): a step computes its own position
only, with the values of teacher forcing under the causal mask.

Initialisation (:func:`~phrasescore.model.initialization.init_transformer`): every matrix
Xavier-uniform (Glorot & Bengio 2010, as tensor2tensor and :class:`torch.nn.Transformer`),
biases 0, embeddings N(0, 1/d) so that √d E x has unit variance, LayerNorm gains 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from phrasescore.model.attention import source_mask
from phrasescore.model.base import EncoderDecoder, EncoderOutput, padded_lengths
from phrasescore.model.config import ModelConfig
from phrasescore.model.initialization import init_transformer
from phrasescore.special_ids import PAD_ID


def sinusoid_positions(length: int, dim: int, device: torch.device, start: int = 0) -> Tensor:
    """PE [length, dim] of the positions start, ..., start + length - 1: sin at the even units,
    cos at the odd ones, of pos / 10000^(2i/d) (Vaswani et al. §3.5)."""
    position = torch.arange(start, start + length, dtype=torch.float32, device=device).unsqueeze(1)
    rate = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim)
    )
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: dim // 2])
    return table


def causal_mask(length: int, device: torch.device) -> Tensor:
    """[T, T] True on and below the diagonal: decoder position i attends to positions <= i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1 .. head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K,
    V W_i^V) (Vaswani et al. eq. 1 and §3.2.2), the h heads' projections in one product each;
    the scaled dot products by :func:`torch.nn.functional.scaled_dot_product_attention` (a
    fused kernel where the device has one), with dropout on the attention weights."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)
        self.output = nn.Linear(dim, dim)

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """K W^K and V W^V of ``memory`` [B, S, d], each [B, heads, S, d / heads]."""
        batch, length, dim = memory.shape
        both = self.key_value(memory).view(batch, length, 2, self.heads, dim // self.heads)
        key, value = both.permute(2, 0, 3, 1, 4)
        return key, value

    def attend(self, x: Tensor, key: Tensor, value: Tensor, allowed: Tensor | None) -> Tensor:
        """Queries from ``x`` [B, T, d] over keys and values [B, heads, S, d / heads];
        ``allowed`` (broadcast to [B, heads, T, S]) True where query t may attend to key s,
        None: everywhere."""
        batch, steps, dim = x.shape
        query = self.query(x).view(batch, steps, self.heads, dim // self.heads).transpose(1, 2)
        heads = F.scaled_dot_product_attention(
            query, key, value, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0
        )
        return self.output(heads.transpose(1, 2).reshape(batch, steps, dim))

    def forward(self, x: Tensor, memory: Tensor, allowed: Tensor | None) -> Tensor:
        return self.attend(x, *self.keys_values(memory), allowed)


class FeedForward(nn.Sequential):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Vaswani et al. eq. 2), dropout after the ReLU."""

    def __init__(self, dim: int, width: int, dropout: float):
        super().__init__(
            nn.Linear(dim, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, dim)
        )


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each as x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, dim: int, heads: int, width: int, dropout: float):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = MultiHeadAttention(dim, heads, dropout)
        self.feedforward_norm = nn.LayerNorm(dim)
        self.feedforward = FeedForward(dim, width, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, allowed: Tensor | None) -> Tensor:
        normed = self.attention_norm(x)
        x = x + self.dropout(self.attention(normed, normed, allowed))
        return x + self.dropout(self.feedforward(self.feedforward_norm(x)))


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder's output, then the FFN, each as
    x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, dim: int, heads: int, width: int, dropout: float):
        super().__init__()
        self.self_attention_norm = nn.LayerNorm(dim)
        self.self_attention = MultiHeadAttention(dim, heads, dropout)
        self.source_attention_norm = nn.LayerNorm(dim)
        self.source_attention = MultiHeadAttention(dim, heads, dropout)
        self.feedforward_norm = nn.LayerNorm(dim)
        self.feedforward = FeedForward(dim, width, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, y: Tensor, memory: Tensor, causal: Tensor, source: Tensor) -> Tensor:
        normed = self.self_attention_norm(y)
        y = y + self.dropout(self.self_attention(normed, normed, causal))
        return self._over_source(y, *self.source_attention.keys_values(memory), source)

    def _over_source(self, y: Tensor, key: Tensor, value: Tensor, source: Tensor) -> Tensor:
        """The two sublayers after the self-attention: attention over the source's keys and
        values, then the FFN."""
        y = y + self.dropout(
            self.source_attention.attend(self.source_attention_norm(y), key, value, source)
        )
        return y + self.dropout(self.feedforward(self.feedforward_norm(y)))

    def step(
        self, y: Tensor, cache: tuple[Tensor, Tensor], memory: tuple[Tensor, Tensor], source: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`forward` for one new position ``y`` [B, 1, d]: its self-attention over the
        keys and values ``cache`` of the earlier positions and its own (returned, extended), its
        attention over the source's keys and values ``memory``."""
        normed = self.self_attention_norm(y)
        key, value = self.self_attention.keys_values(normed)
        keys, values = torch.cat([cache[0], key], dim=2), torch.cat([cache[1], value], dim=2)
        y = y + self.dropout(self.self_attention.attend(normed, keys, values, None))
        return self._over_source(y, *memory, source), keys, values


class TransformerEncoderDecoder(EncoderDecoder):
    """Vaswani et al. (2017): self-attention encoder and decoder, pre-norm layers."""

    POSITIONAL_OUTPUTS = ("memory", "valid")

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        dim, heads, width, layers = (
            config.hidden_dim,
            config.heads,
            config.feedforward_dim,
            config.layers,
        )
        if heads < 1 or dim % heads:
            raise ValueError(f"{heads} attention heads do not divide {dim} hidden units")
        self.src_embed = nn.Embedding(config.src_vocab_size, dim, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, dim, padding_idx=PAD_ID)
        sizes = (dim, heads, width, config.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(*sizes) for _ in range(layers))
        self.encoder_norm = nn.LayerNorm(dim)
        self.decoder = nn.ModuleList(DecoderLayer(*sizes) for _ in range(layers))
        self.decoder_norm = nn.LayerNorm(dim)
        rank = config.output_rank
        self.out_rank = nn.Identity() if rank == dim else nn.Linear(dim, rank, bias=False)
        self.out_vocab = nn.Linear(rank, config.tgt_vocab_size)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_transformer(self)

    def _embed(self, table: nn.Embedding, ids: Tensor, start: int = 0) -> Tensor:
        """Dropout(√d E x + PE) (Vaswani et al. §3.4, §3.5, §5.4), the first word of ``ids`` at
        position ``start``."""
        dim = self.config.hidden_dim
        embedded = table(ids)
        positions = sinusoid_positions(ids.shape[1], dim, ids.device, start).to(embedded.dtype)
        return self.dropout(embedded * math.sqrt(dim) + positions)

    def encode(self, src: Tensor, src_lengths: Tensor | None) -> EncoderOutput:
        """The encoder stack's normalised output ``memory`` [B, S, d] and the source mask
        ``valid`` [B, S] (True at real positions, the only keys attended to)."""
        lengths = padded_lengths(src_lengths, src.shape[1])
        valid = source_mask(src, lengths)
        allowed = None if lengths is None else valid[:, None, None, :]
        x = self._embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, allowed)
        return {"memory": self.encoder_norm(x), "valid": valid}

    def summary_vector(self, enc: EncoderOutput) -> Tensor:
        """The mean of the encoder's outputs over the real source positions."""
        weights = enc["valid"].to(enc["memory"].dtype).unsqueeze(2)
        return (enc["memory"] * weights).sum(1) / weights.sum(1)

    def decode_features(self, enc: EncoderOutput, tgt_in: Tensor) -> Tensor:
        causal = causal_mask(tgt_in.shape[1], tgt_in.device)
        source = enc["valid"][:, None, None, :]
        y = self._embed(self.tgt_embed, tgt_in)
        for layer in self.decoder:
            y = layer(y, enc["memory"], causal, source)
        return self.out_rank(self.decoder_norm(y))

    def start(self, enc: EncoderOutput) -> dict[str, Tensor]:
        """The decoder's state before its first word: per layer, the source's keys and values
        (computed once) and the keys and values of the words so far (none yet)."""
        state = {"valid": enc["valid"]}
        for index, layer in enumerate(self.decoder):
            key, value = layer.source_attention.keys_values(enc["memory"])
            state[f"source_keys{index}"], state[f"source_values{index}"] = key, value
            state[f"keys{index}"], state[f"values{index}"] = key[:, :, :0], value[:, :, :0]
        return state

    def step(self, state: dict[str, Tensor], prev: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The features after the words so far and ``prev``: each layer's self-attention reads
        the keys and values cached by the earlier steps (the same values as teacher forcing
        with the causal mask)."""
        y = self._embed(self.tgt_embed, prev.unsqueeze(1), start=state["keys0"].shape[2])
        source = state["valid"][:, None, None, :]
        new = dict(state)
        for index, layer in enumerate(self.decoder):
            cache = (state[f"keys{index}"], state[f"values{index}"])
            memory = (state[f"source_keys{index}"], state[f"source_values{index}"])
            y, new[f"keys{index}"], new[f"values{index}"] = layer.step(y, cache, memory, source)
        return self.out_rank(self.decoder_norm(y))[:, 0], new

    def scoring_flops(self, src_len: float, tgt_len: float, share: float = 1.0) -> float:
        """Floating-point operations (2 per multiply-add) to score one pair teacher-forced.

        Per source token and layer: Q, K, V and the output projection (4 d²), the attention
        over ``src_len`` positions (2 d each), the FFN (2 d F) and the decoder's K and V of it
        (2 d²); per target token and layer: self-attention (4 d² + 2 d ``tgt_len``), Q and the
        output of the attention over the source (2 d² + 2 d ``src_len``) and the FFN; then the
        output layer. ``share``: the fraction of a source's encoding charged to this pair.
        """
        cfg = self.config
        dim, width, layers = cfg.hidden_dim, cfg.feedforward_dim, cfg.layers
        rank, vocab = cfg.output_rank, cfg.tgt_vocab_size
        per_src_token = layers * (4 * dim * dim + 2 * dim * src_len + 2 * dim * width)
        per_src_token += layers * 2 * dim * dim
        per_tgt_token = layers * (4 * dim * dim + 2 * dim * tgt_len)
        per_tgt_token += layers * (2 * dim * dim + 2 * dim * src_len + 2 * dim * width)
        per_tgt_token += (0 if rank == dim else dim * rank) + rank * vocab
        return 2.0 * (share * src_len * per_src_token + tgt_len * per_tgt_token)
