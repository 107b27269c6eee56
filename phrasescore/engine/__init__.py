"""The engine: batched scoring and search over ids (no files, no Moses formats).

``scoring`` scores (source, target) pairs with an encoder-decoder, ``search`` runs beam search and
sampling, ``lm_scoring`` scores token sequences with the CSLM.
"""
