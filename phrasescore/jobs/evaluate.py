"""The ``evaluate`` job: corpus BLEU (Papineni et al. 2002) and chrF (Popović 2015) with sacrebleu.

It returns sacrebleu's signatures, which say exactly how the figures were computed; ``translate
--reference`` reports the same figures for its 1-best output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from phrasescore.errors import InputError
from phrasescore.files import display_name, iter_lines


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


def evaluate(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a", lowercase=False
) -> Evaluation:
    """BLEU and chrF of ``hypotheses`` against ``references`` (one reference per sentence)."""
    sacrebleu = require_sacrebleu()
    if len(hypotheses) != len(references):
        raise InputError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "they must be line-aligned"
        )
    try:
        bleu = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    except Exception as exc:  # sacrebleu raises various types for an unknown tokenizer
        raise InputError(f"sacrebleu refuses --tokenize {tokenize!r}: {exc}") from None
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


def evaluate_files(
    hypothesis_path: str, reference_path: str, tokenize: str = "13a", lowercase: bool = False
) -> Evaluation:
    """:func:`evaluate` of two line-aligned files (plain or gzip; one may be ``-``)."""
    if hypothesis_path == "-" and reference_path == "-":
        raise InputError("only one of HYPOTHESES and REFERENCE can be standard input")
    require_sacrebleu()
    hyps = list(iter_lines(hypothesis_path))
    refs = list(iter_lines(reference_path))
    if len(hyps) != len(refs):
        raise InputError(
            f"{display_name(hypothesis_path)} has {len(hyps)} lines but "
            f"{display_name(reference_path)} has {len(refs)}: they must be line-aligned"
        )
    return evaluate(hyps, refs, tokenize=tokenize, lowercase=lowercase)
