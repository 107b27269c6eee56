"""Memory does not grow with the table: oneDNN's per-shape caches are bounded."""

from __future__ import annotations

import os
import subprocess
import sys

CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
SHOW = f"import os, phrasescore; print(*(os.environ.get(n) for n in {CACHES!r}))"


def _run(env: dict) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_importing_phrasescore_bounds_the_onednn_shape_caches():
    # A new batch shape per batch makes RSS grow with the table under oneDNN's default of 1,024
    # cached shapes (docs/benchmarks.md, "Engine of commit 41fe511"; tools/bench-rss), so
    # phrasescore sets a small bound.
    env = {k: v for k, v in os.environ.items() if k not in CACHES}
    values = _run(env)
    assert values != ["None", "None"]
    assert all(0 < int(v) <= 64 for v in values)


def test_a_cache_capacity_set_by_the_user_wins():
    env = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "7", "LRU_CACHE_CAPACITY": "9"}
    assert _run(env) == ["7", "9"]
