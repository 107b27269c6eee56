"""The special token ids, defined once for the networks and the vocabularies (Joey NMT's
``constants.py``).

A network knows ids, not vocabularies: its embeddings keep row :data:`PAD_ID` at zero, the decoder
starts from :data:`BOS_ID` and a sequence ends with :data:`EOS_ID`. The vocabularies of
:mod:`phrasescore.text.vocab` give their special symbols these ids. Both ``model/`` and ``text/``
import them from here, below both, so neither layer imports the other and nothing has to check
at run time that two copies agree.
"""

PAD_ID = 0
"""Padding, and the NULL context word of the CSLM; its embedding is fixed at 0."""
UNK_ID = 1
"""Every word outside the vocabulary."""
BOS_ID = 2
"""Beginning of sequence: the decoder's first input, the CSLM's context before a sentence."""
EOS_ID = 3
"""End of sequence: the last source token and the last predicted target token."""

SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
"""The four special ids, in the order PAD, UNK, BOS, EOS."""
