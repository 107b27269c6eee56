"""The special token ids every network is built around (Joey NMT's ``constants.py``).

A network knows ids, not vocabularies: its embeddings keep row :data:`PAD_ID` at zero, the decoder
starts from :data:`BOS_ID` and a sequence ends with :data:`EOS_ID`. The vocabularies of
:mod:`phrasescore.text.vocab` give their special symbols the same ids; the model file
(:mod:`phrasescore.bundle`) checks that the two agree, so neither layer imports the other.
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
