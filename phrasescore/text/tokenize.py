"""Turning a line of text into the tokens a model sees, the way Moses pipelines do.

Moses pipelines tokenise with ``tokenizer.perl -l LANG`` (which escapes ``& | < > ' " [ ]`` as
``&amp; &#124; &lt; &gt; &apos; &quot; &#91; &#93;``) and then lowercase with
``lowercase.perl`` (or truecase). Phrase tables and n-best lists hold such tokens, so a model must
see text prepared the same way:

* without ``tokenize`` a line is already tokenised: it is split on spaces and tabs, the separators
  Moses itself uses when it reads a phrase table (tokens stay Moses-escaped);
* with ``tokenize`` a raw line goes through sacremoses' ``MosesTokenizer(lang)`` with escaping on
  and no aggressive dash splitting (the defaults of ``tokenizer.perl``), plus one correction
  described below;
* with ``lowercase`` the tokens are lowercased *after* tokenising, as ``lowercase.perl`` lowercases
  tokenised text (Python's ``str.lower``; Perl's ``lc`` agrees on these languages).

Measured agreement with ``tokenizer.perl`` (``tools/check-tokenizer``): the raw Multi30k training
text (``multi30k/train.{en,fr}.gz``, 29,000 lines each) tokenised and lowercased here, compared
line by line with the tokens the Moses system was built from
(``moses-multi30k/train.tok.lc.{en,fr}.gz``):

=========================================  =========  ==========
                                           English    French
=========================================  =========  ==========
plain sacremoses 0.2.0                     3 differ   35 differ
with the final-period correction (used)    0 differ   0 differ
=========================================  =========  ==========

Every one of those 38 lines differs in the same way: a sentence-final period stays attached to the
last word when that word is a nonbreaking prefix or contains a dot, e.g.

* en 2324 ``... that read C U B S.`` -> sacremoses ``c u b s.``, tokenizer.perl ``c u b s .``
  (single letters are nonbreaking prefixes; also ``at a Q&amp;A.`` and ``near 3rd St.``);
* fr 100 ``... une sculpture d'art.`` -> sacremoses ``d&apos; art.``, tokenizer.perl
  ``d&apos; art .`` (``art`` -- *article* -- is a French nonbreaking prefix; so are ``vol`` and
  ``s`` in ``McDonald's.``);
* fr 12985 ``... banderole avrovulcan.com.`` -> ``avrovulcan.com.`` vs ``avrovulcan.com .``
  (a word containing a dot and a letter is never split before its period).

``tokenizer.perl`` (mosesdecoder, ``tokenize()``) splits the period of the *last* word of a line
unconditionally ("split last words independently as they are unlikely to be non-breaking
prefixes") before it consults the prefix list; sacremoses 0.2.0 lacks that rule. The
:class:`_PerlCompatibleMosesTokenizer` here adds it back, at the same step of the pipeline (before
multi-dots are restored and before escaping), which makes all 58,000 lines identical (and the
4,028 lines of ``val`` and ``test_2016_flickr``, where plain sacremoses differs on 2 French lines).

Tokenising already-tokenised text is not idempotent (``&amp;`` becomes ``&amp; amp ;``), so text
that is tokenised already -- phrase-table phrases, n-best hypotheses -- must go through
:meth:`TextNormalizer.normalize_tokenized`, never through the tokenizer again.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_ENDS_WITH_PERIOD = re.compile(r"^(\S+)\.$")


@functools.cache
def _perl_compatible_tokenizer_class() -> type:
    """sacremoses' ``MosesTokenizer`` with ``tokenizer.perl``'s rule for the last word of a line.

    In ``tokenizer.perl`` a last word ending in a period is always split (``word.`` -> ``word .``),
    whatever the nonbreaking-prefix list says; every other word follows sacremoses' (identical)
    rules. The rule is applied to the text handed to sacremoses' nonbreaking-prefix step, which
    is where ``tokenizer.perl`` applies it. (Made on first use: sacremoses takes most of a second
    to import, and only raw text needs it.)
    """
    from sacremoses import MosesTokenizer

    class PerlCompatibleMosesTokenizer(MosesTokenizer):
        def handles_nonbreaking_prefixes(self, text: str) -> str:  # sacremoses hook, see above
            tokens = text.split()
            if tokens:
                match = _ENDS_WITH_PERIOD.match(tokens[-1])
                if match:
                    tokens[-1] = match.group(1)
                    tokens.append(".")
            return super().handles_nonbreaking_prefixes(" ".join(tokens))

    return PerlCompatibleMosesTokenizer


def split_moses_tokens(line: str) -> list[str]:
    """Split already-tokenised text into tokens on runs of spaces and tabs, as Moses does."""
    if "\t" in line:
        line = line.replace("\t", " ")
    tokens = line.split(" ")
    if "" in tokens:  # a run of spaces, or one at an end (rare: most lines skip this copy)
        return [token for token in tokens if token]
    return tokens


class TextNormalizer:
    """Makes the tokens of one language side from a line of text (see the module docstring).

    ``TextNormalizer(lang, tokenize, lowercase)(line) -> list[str]``. The settings are saved in
    the model file (:meth:`to_state`) so that scoring prepares text exactly as training did.
    """

    def __init__(self, lang: str, tokenize: bool = False, lowercase: bool = False):
        self.lang = lang
        self.tokenize = tokenize
        self.lowercase = lowercase
        self._tokenizer = _perl_compatible_tokenizer_class()(lang) if tokenize else None

    def __call__(self, line: str) -> list[str]:
        """The tokens of a line of this side's training text (raw when ``tokenize`` is on)."""
        if self._tokenizer is not None:
            tokens = self._tokenizer.tokenize(
                line, aggressive_dash_splits=False, return_str=False, escape=True
            )
            if self.lowercase:
                return [token.lower() for token in tokens]
            return tokens
        return self.normalize_tokenized(line)

    def normalize_tokenized(self, text: str) -> list[str]:
        """The tokens of text that is Moses-tokenised already (a phrase, an n-best hypothesis).

        Splits on spaces and tabs and applies ``lowercase``; never tokenises again.
        """
        tokens = split_moses_tokens(text)
        if self.lowercase:
            return [token.lower() for token in tokens]
        return tokens

    def to_state(self) -> dict[str, Any]:
        """The settings as a JSON-serialisable dict (stored in the model file)."""
        return {"lang": self.lang, "tokenize": self.tokenize, "lowercase": self.lowercase}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TextNormalizer:
        """The normalizer that :meth:`to_state` described."""
        return cls(
            lang=str(state["lang"]),
            tokenize=bool(state["tokenize"]),
            lowercase=bool(state["lowercase"]),
        )

    def __repr__(self) -> str:
        return (
            f"TextNormalizer(lang={self.lang!r}, tokenize={self.tokenize}, "
            f"lowercase={self.lowercase})"
        )
