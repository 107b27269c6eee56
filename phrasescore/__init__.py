"""phrasescore: neural phrase scores for Moses phrase tables (Cho et al. 2014)."""

import os as _os
import time as _time

__version__ = "0.1.0"

STARTED = _time.monotonic()
"""When this process first imported phrasescore (every command does, before torch): the start
of the start-up that the scoring commands log (:func:`phrasescore.progress.log_startup`)."""

# Bounded oneDNN caches. On CPU, bf16 (and some fp32) matrix products go through oneDNN, which
# keeps one compiled kernel per distinct matrix shape in two caches of 1,024 entries each (oneDNN's
# primitive cache and ideep's LRU cache, the latter holding its own copy of reordered weights).
# Scoring makes a new shape for almost every batch (rows = pairs of one length in a chunk), so
# with the defaults the resident memory grows with the table. 32 entries hold every shape a batch
# loop reuses; both variables are read when oneDNN is first used, so setting them here (before
# any scoring) is enough, and a value set by the user wins. The figures, from tools/bench-rss:
# docs/benchmarks.md, "Engine of commit 41fe511" and "Peak memory of rescore".
ONEDNN_CACHE_CAPACITY = "32"
for _name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    _os.environ.setdefault(_name, ONEDNN_CACHE_CAPACITY)

# OpenMP threads that sleep when they run out of work instead of spinning (libgomp's default spins
# for up to ~300,000 iterations first). Scoring alternates short parallel products with
# single-threaded Python (batching, tokenising, writing), and a spinning worker burns a core
# through all of it -- and under load takes it from the processes beside it (the CPU-seconds and
# wall time of both: docs/benchmarks.md, "OpenMP threads sleeping or spinning"). Read when the
# OpenMP runtime loads (at `import torch`, which comes after this module in every phrasescore
# command); a value set by the user wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
