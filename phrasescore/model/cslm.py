"""CSLM: the feed-forward n-gram target language model of Schwenk (2007), "Continuous space
language models" (docs/commands.md, `phrasescore train-lm`).

Cho et al. (2014, §4.1) add a continuous-space language model (CSLM) of the target language to
the RNN Encoder-Decoder features; its gain adds to theirs (Cho et al. 2014, Table 1). The network (Bengio et al.
2003; Schwenk 2007) predicts a word from the ``n - 1`` words before it::

    x = [e(w_{t-n+1}); ...; e(w_{t-1})]        one embedding matrix shared by all positions
    h_1 = relu(W_1 x + b_1), ..., h_k = relu(W_k h_{k-1} + b_k)
    p(w_t | w_{t-n+1..t-1}) = softmax(W_o h_k + b_o)

Paper size (``--preset paper``): order 7 (6 context words), 512-dim embeddings, rectified hidden
layers of 3072, 1536 and 1024 units, softmax over the vocabulary. Differences from Schwenk's
CSLM, all deliberate: the softmax covers the whole word vocabulary (with one unknown-word symbol,
as the encoder-decoder's vocabulary) instead of a short list backed off to an n-gram model, and
training uses Adam.

Contexts
--------
* **Sentences** (n-best hypotheses, perplexity): the words before the sentence start are ``<s>``
  (BOS), i.e. the first word is predicted from ``<s> ... <s>``, and ``</s>`` (EOS) is predicted
  after the last word, as in n-gram toolkits.
* **Phrases** (a phrase-table column): a phrase is a fragment of a sentence whose preceding words
  are unknown, so the words before it are the NULL symbol (PAD, whose embedding is fixed at 0)
  rather than ``<s>``, and no ``</s>`` is predicted: p(phrase) = Π p(w_i | NULL.. w_<i).
  To make these probabilities meaningful the network is trained with *context truncation*: with
  probability ``truncate_context`` a training n-gram keeps only its last k context words
  (k uniform in 0..n-2) and the others are replaced by NULL, so it also learns p(w | shorter
  history), down to the unigram p(w | NULL ... NULL). Validation never truncates.

The network is trained by :mod:`phrasescore.training.lm_trainer` with the encoder-decoder's loop: its
:meth:`FeedForwardLM.loss` takes the trainer's batch tensors (the source is ignored).

Files: one ``.safetensors`` file like an encoder-decoder model but with
``format = phrasescore-lm``, written and read by :mod:`phrasescore.bundle` (``save_lm``,
``load_lm``; ``load_model`` refuses it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from phrasescore.model.base import LossTerms, bf16_autocast
from phrasescore.model.config import LM_PRESETS, TrainConfig
from phrasescore.model.initialization import init_cslm
from phrasescore.model.output_layer import token_nll
from phrasescore.special_ids import BOS_ID, PAD_ID


@dataclass
class LMConfig:
    """Sizes of a feed-forward n-gram language model; saved with it."""

    arch: str = "cslm"
    order: int = 5
    """n: the model predicts a word from the n - 1 words before it."""
    embedding_dim: int = 128
    hidden_dims: list[int] = field(default_factory=lambda: [512, 256])
    dropout: float = 0.1
    truncate_context: float = 0.1
    """Fraction of training n-grams whose far context is replaced by NULL (module docstring)."""
    init_std: float = 0.01
    vocab_size: int = 0

    def __post_init__(self) -> None:
        self.hidden_dims = [int(h) for h in self.hidden_dims]

    @property
    def context_size(self) -> int:
        return self.order - 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def lm_preset(name: str) -> tuple[LMConfig, TrainConfig]:
    """The model and training configuration of a named LM preset."""
    if name not in LM_PRESETS:
        raise KeyError(name)
    model_kw, train_kw = LM_PRESETS[name]
    return LMConfig(**model_kw), TrainConfig(**train_kw)


class FeedForwardLM(nn.Module):
    """The CSLM network (see the module docstring)."""

    def __init__(self, config: LMConfig):
        super().__init__()
        if config.order < 2:
            raise ValueError(f"a CSLM needs order >= 2, got {config.order}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=PAD_ID)
        layers: list[nn.Module] = []
        width = config.context_size * config.embedding_dim
        for units in config.hidden_dims:
            layers += [nn.Linear(width, units), nn.ReLU(), nn.Dropout(config.dropout)]
            width = units
        self.hidden = nn.Sequential(*layers)
        self.output = nn.Linear(width, config.vocab_size)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings N(0, init_std²); hidden layers He-uniform (rectifiers); zero biases."""
        init_cslm(self)

    def forward(self, context: Tensor) -> Tensor:
        """Logits [N, V] of the next word for contexts [N, n - 1] (oldest word first)."""
        x = self.dropout(self.embed(context).flatten(1))
        return self.output(self.hidden(x))

    def windows(self, tgt_in: Tensor) -> Tensor:
        """Contexts [B, T, n - 1] for every position of a decoder-input batch ``[BOS] + ids``:
        the context of position t ends with ``tgt_in[:, t]`` and is filled with BOS on the left
        (sentence mode)."""
        left = tgt_in.new_full((tgt_in.shape[0], self.config.context_size - 1), BOS_ID)
        return torch.cat([left, tgt_in], dim=1).unfold(1, self.config.context_size, 1)

    def truncate(self, context: Tensor) -> Tensor:
        """Replace the far context of a random ``truncate_context`` fraction of rows by NULL."""
        rate = self.config.truncate_context
        n_ctx = self.config.context_size
        if rate <= 0.0 or not self.training:
            return context
        rows = context.shape[0]
        chosen = torch.rand(rows, device=context.device) < rate
        keep = torch.randint(0, n_ctx, (rows,), device=context.device)  # words kept, 0..n-2
        first_kept = torch.where(chosen, n_ctx - keep, 0)
        positions = torch.arange(n_ctx, device=context.device)
        return context.masked_fill(positions[None, :] < first_kept[:, None], PAD_ID)

    def loss(
        self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor, tgt_mask: Tensor
    ) -> Tensor:
        """Summed negative log-likelihood of the real tokens of ``tgt_out`` (EOS included).

        The signature is the encoder-decoder's (``EncoderDecoder.loss``) so that the same
        trainer runs both; ``src`` and ``src_lengths`` are ignored.
        """
        context = self.truncate(self.windows(tgt_in)[tgt_mask])
        nll, _ = token_nll(self(context), tgt_out[tgt_mask])
        return nll

    def loss_terms(
        self,
        src: Tensor,
        src_lengths: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor,
        tgt_mask: Tensor,
        log_z: bool = False,
        bf16_output: bool = False,
    ) -> LossTerms:
        """:meth:`loss` as the trainer takes it (``EncoderDecoder.loss_terms``): the CSLM is not
        self-normalised, so the objective is the NLL and no log Z is computed. ``bf16_output``:
        the network (a feed-forward stack ending in the vocabulary projection) under bf16
        autocast."""
        with bf16_autocast(tgt_in.device, bf16_output):
            nll = self.loss(src, src_lengths, tgt_in, tgt_out, tgt_mask)
        return LossTerms(nll, nll.detach(), None)

    def word_embeddings(self) -> Tensor:
        return self.embed.weight
