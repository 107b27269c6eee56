"""phrasescore: neural phrase scores for Moses phrase tables (Cho et al. 2014)."""

import os as _os

__version__ = "0.1.0"

# Bounded oneDNN caches. On CPU, bf16 (and some fp32) matrix products go through oneDNN, which
# keeps one compiled kernel per distinct matrix shape in two caches of 1,024 entries each (oneDNN's
# primitive cache and ideep's LRU cache, the latter holding its own copy of reordered weights).
# Scoring makes a new shape for almost every batch (rows = pairs of one length in a chunk), so
# with the defaults the resident memory grew with the table, ~0.5-2 MB per new shape. 32 entries
# hold every shape a batch loop reuses; both variables are read when oneDNN is first used, so
# setting them here (before any scoring) is enough, and a value set by the user wins.
# Measured in issue 14 (tools/bench-rss).
ONEDNN_CACHE_CAPACITY = "32"
for _name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    _os.environ.setdefault(_name, ONEDNN_CACHE_CAPACITY)
