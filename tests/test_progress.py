"""Progress on stderr: one shared bar, a line every LOG_INTERVAL seconds when stderr
is a log, not a terminal; ``train --no-progress``; ``train --resume`` with nothing to resume."""

from __future__ import annotations

import io
import sys

from phrasescore import progress
from phrasescore.progress import progress_bar

from .conftest import DATA, run_cli

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"


def _bar_lines(stderr: str, marker: str) -> list[str]:
    return [line for line in stderr.splitlines() if marker in line]


def test_a_log_gets_lines_not_one_redraw_per_update(monkeypatch):
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(progress.sys, "stderr", log)
    bar = progress_bar(True, total=1000, desc="work")
    for _ in range(1000):
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    # the first draw and the complete bar (1,000 updates within LOG_INTERVAL = 30 s)
    assert len(lines) == 2 and lines[0].startswith("work:   0%") and "1000/1000" in lines[-1]
    silent = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", silent)
    quiet = progress_bar(False, total=10)
    quiet.update(10)
    quiet.close()
    assert silent.getvalue() == ""


def test_rescore_into_a_log_writes_two_bar_lines(tiny_model_path, tmp_path):
    flags = ["-m", tiny_model_path, "--chunk-lines", "10", "--threads", "1"]
    proc = run_cli("rescore", TABLE, *flags, "-o", tmp_path / "out.gz")
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    bars = _bar_lines(proc.stderr, "rescore:")
    # the first draw and the complete bar; one more line per LOG_INTERVAL (30 s) that a slow,
    # loaded machine spends on it: at least 2 lines, never one redraw per chunk (30 chunks)
    assert 2 <= len(bars) < 30 and "100%" in bars[-1], proc.stderr


def test_train_no_progress_and_resume_with_nothing_to_resume(corpus_files, tmp_path):
    model = tmp_path / "m.safetensors"
    args = ["train", *corpus_files, "-o", model, "--preset", "tiny", "--max-steps", "6"]
    args += ["--valid-every", "3", "--threads", "1"]
    proc = run_cli(*args, "--resume", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert f"nothing to resume: no checkpoint {model}.checkpoint yet; training from the " in (
        proc.stderr
    )
    assert "step/s" not in proc.stderr and "\r" not in proc.stderr
    assert model.exists() and (tmp_path / "m.safetensors.checkpoint").exists()
    # with a checkpoint, --resume goes on from it (here: the run is over at step 6)
    again = run_cli(*args, "--resume")
    assert again.returncode == 0, again.stderr
    assert f"resuming at step 6 of {model}.checkpoint (epoch 1, best validation perplexity " in (
        again.stderr
    )
    assert "\tsteps=6\t" in again.stdout  # a finished run makes no step more
    assert len(_bar_lines(again.stderr, "step/s")) == 2 and "\r" not in again.stderr


def test_train_into_a_log_writes_a_line_per_log_interval_not_per_second(
    corpus_files, tmp_path, monkeypatch
):
    """The postfix (loss, tok/s), set every second, must not redraw the bar each time (tqdm's
    set_postfix refreshes unless told not to): that is one line per second in a log. Here every
    step is 2 s apart on the trainer's clock and tqdm's clock stands still, so only a forced
    redraw can add a line: the first draw and the complete bar are all there is."""
    import itertools
    from types import SimpleNamespace

    import tqdm.std

    from phrasescore.jobs.training import train

    from .conftest import train_tiny

    # the modules of the run's start (its clock) and of the step, wherever they are
    modules = {
        sys.modules[train.Trainer._start.__module__],
        sys.modules[train.Trainer._step.__module__],
    }

    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(progress.sys, "stderr", log)
    clock = itertools.count(0.0, 2.0)
    for module in modules:
        monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(tqdm.std, "time", lambda: 0.0)
    train_tiny(tmp_path / "m.safetensors", *corpus_files, max_steps=8, valid_every=4, seed=3)
    bars = _bar_lines(log.getvalue(), "step")
    assert len(bars) == 2, log.getvalue()
    assert bars[0].startswith("  0%") and "8/8" in bars[-1] and "loss=" in bars[-1]
