"""examples/run.sh --quick: the README's main-job command, end to end on the shipped data."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

from phrasescore.moses.ini import count_features_and_weights, list_phrase_tables
from phrasescore.moses.phrase_table import format_entry, read_phrase_table

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_example_run_quick(tmp_path):
    before = sorted(p.relative_to(EXAMPLES) for p in EXAMPLES.rglob("*"))
    env = {k: v for k, v in os.environ.items() if k not in ("MOSES_HOME", "MOSES")}
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "run.sh"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=2400,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "phrase-table.rescored.gz" in proc.stdout
    assert sorted(p.relative_to(EXAMPLES) for p in EXAMPLES.rglob("*")) == before  # only read
    table_in = EXAMPLES / "model" / "phrase-table.gz"
    table_out = tmp_path / "recipe" / "model" / "phrase-table.rescored.gz"
    with (
        gzip.open(table_in, "rt", encoding="utf-8") as a,
        gzip.open(table_out, "rt", encoding="utf-8") as b,
    ):
        assert sum(1 for _ in a) == sum(1 for _ in b) == 49446
    for old, new in zip(
        read_phrase_table(str(table_in)), read_phrase_table(str(table_out)), strict=True
    ):
        assert len(new.scores) == len(old.scores) + 1
        assert format_entry(new._replace(scores=new.scores[:-1])) == format_entry(old)
        assert 0 < float(new.scores[-1]) <= 1
    ini = (tmp_path / "recipe" / "model" / "moses.rescored.ini").read_text()
    (table,) = list_phrase_tables(ini)
    assert table.num_features == 5 and table.path == str(table_out)
    counts = count_features_and_weights(ini)
    assert counts["TranslationModel0"] == (5, 5)
    for name, (features, weights) in counts.items():
        if features is not None:
            assert features == weights, name
    # the recipe's five models, each with its log, curve and result line
    for name in ("column", "l2r", "r2l", "inverse", "lstm"):
        model = tmp_path / "recipe" / "nn" / f"{name}.safetensors"
        assert (
            model.stat().st_size > 0
            and (tmp_path / "recipe" / "nn" / f"{name}.safetensors.log").exists()
        )
        assert (tmp_path / "recipe" / "nn" / f"{name}.safetensors.curve.png").stat().st_size > 0
        assert (
            "\tsteps=30\t" in (tmp_path / "recipe" / "nn" / f"{name}.result").read_text()
        )  # --quick
        assert (tmp_path / "recipe" / "logs" / f"train-{name}.stamp").exists()
    # no Moses here: its steps are reported as skipped, and the demo says how to run them
    words = [line.split() for line in proc.stdout.splitlines()]
    steps = {w[0]: " ".join(w[1:]) for w in words if w and w[0] in ("rescore", "mert")}
    assert steps["rescore"].startswith("ran in") and steps["mert"].startswith("skipped (needs")
    assert "set MOSES_HOME" in proc.stdout
    assert len((tmp_path / "system" / "dev.en").read_text().splitlines()) == 50
    # run again: every step is up to date, nothing is redone
    again = subprocess.run(
        ["bash", str(EXAMPLES / "run.sh"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=2400,
        env=env,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    states = {w[0]: " ".join(w[1:]) for w in map(str.split, again.stdout.splitlines()) if w}
    assert "ran in" not in again.stdout and states["train-l2r"] == "up to date"
