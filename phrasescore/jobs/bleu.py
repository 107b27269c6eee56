"""BLEU (Papineni et al. 2002) and chrF (Popović 2015) with sacrebleu, as every job that reports
them computes them (``evaluate``, ``translate --reference``, ``ab``), with sacrebleu's signatures,
which say exactly how the figures were computed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from phrasescore.errors import InputError

log = logging.getLogger(__name__)

TOKENISED_LINES = 100
"""Hypotheses ending in a tokenised period (`` .``) from which text is taken to be tokenised
(sacrebleu's own threshold for its warning)."""


@dataclass
class Evaluation:
    """Corpus BLEU and chrF of hypotheses against one reference, with sacrebleu's signatures."""

    sentences: int
    bleu: float
    chrf: float
    bleu_text: str
    chrf_text: str
    bleu_signature: str
    chrf_signature: str

    def lines(self) -> list[str]:
        """What the commands print: the scores, then the signatures."""
        return [self.bleu_text, self.chrf_text, self.bleu_signature, self.chrf_signature]


def require_sacrebleu():
    try:
        import sacrebleu
    except ImportError:
        raise InputError(
            "evaluation needs sacrebleu, which is not installed: pip install 'phrasescore[eval]' "
            "(or pip install sacrebleu)"
        ) from None
    return sacrebleu


SACREBLEU_TOKENIZERS = ("none", "zh", "13a", "intl", "char", "ja-mecab", "ko-mecab", "spm")
"""sacrebleu's BLEU tokenizers (2.x) where sacrebleu is not installed to say them."""


def tokenizer_names() -> tuple[str, ...]:
    """The BLEU tokenizers sacrebleu knows: the choices of ``--bleu-tokenize``/``--tokenize``,
    checked when the options are parsed, before any work."""
    try:
        from sacrebleu.metrics.bleu import BLEU
    except ImportError:
        return SACREBLEU_TOKENIZERS
    return tuple(BLEU.TOKENIZERS)


def bleu_metric(tokenize: str = "13a", lowercase: bool = False, force: bool | None = None):
    """sacrebleu's BLEU with ``tokenize``: for ``none`` (text tokenised already, as
    multi-bleu.perl scores it) with ``force=True``, so that sacrebleu does not warn that the lines
    end in a tokenised period (``force`` True: never); the signature is the same either way."""
    sacrebleu = require_sacrebleu()
    try:
        return sacrebleu.metrics.BLEU(
            tokenize=tokenize,
            lowercase=lowercase,
            force=tokenize == "none" if force is None else force,
        )
    except Exception as exc:  # sacrebleu raises various types for an unknown tokenizer
        raise InputError(f"sacrebleu refuses --tokenize {tokenize!r}: {exc}") from None


def evaluate(
    hypotheses: Sequence[str],
    references: Sequence[str],
    tokenize: str = "13a",
    lowercase=False,
    flag: str = "--tokenize",
) -> Evaluation:
    """BLEU and chrF of ``hypotheses`` against ``references`` (one reference per sentence).

    Tokenised text scored with a tokenizer other than ``none`` gets one warning of ours, naming
    the command's ``flag`` that scores it as it is, instead of sacrebleu's three lines."""
    sacrebleu = require_sacrebleu()
    if len(hypotheses) != len(references):
        raise InputError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "they must be line-aligned"
        )
    tokenised = sum(hypothesis.endswith(" .") for hypothesis in hypotheses)
    hint = tokenize != "none" and tokenised >= TOKENISED_LINES
    if hint:
        log.warning(
            "%d of %d hypotheses end in a tokenised period (' .'): BLEU with tokenize %s "
            "tokenises tokenised text again; %s none scores its tokens as they are (as ab and "
            "multi-bleu.perl do)",
            tokenised,
            len(hypotheses),
            tokenize,
            flag,
        )
    bleu = bleu_metric(tokenize, lowercase, force=True if hint else None)
    chrf = sacrebleu.metrics.CHRF(lowercase=lowercase)
    refs = [list(references)]
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    return Evaluation(
        sentences=len(hypotheses),
        bleu=float(bleu_score.score),
        chrf=float(chrf_score.score),
        bleu_text=str(bleu_score),
        chrf_text=str(chrf_score),
        bleu_signature=f"BLEU signature: {bleu.get_signature()}",
        chrf_signature=f"chrF signature: {chrf.get_signature()}",
    )
