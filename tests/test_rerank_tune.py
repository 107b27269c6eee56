"""``phrasescore rerank-tune``: bad lists refused in one line before any
Moses tool runs, and, with a real Moses build (MOSES_HOME: bin/extractor, bin/mert, bin/kbmira),
the weights ``ab --rerank``'s step tunes on the same list with the same seed, byte for byte."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sacrebleu.metrics import BLEU

from phrasescore.cli import cli

from .conftest import DATA

NBEST = DATA / "nbest"
LIST = NBEST / "multi30k.test2016.ids0-4.100best.nbest.gz"
SOURCE = NBEST / "multi30k.test2016.head5.tok.lc.en"
REFERENCE = NBEST / "multi30k.test2016.head5.tok.lc.fr"
INI = DATA / "moses" / "multi30k.moses.ini"
MOSES_HOME = os.environ.get("MOSES_HOME")
HAS_TOOLS = bool(MOSES_HOME) and all(
    Path(MOSES_HOME, "bin", tool).is_file() for tool in ("extractor", "mert", "kbmira")
)
needs_moses = pytest.mark.skipif(
    not HAS_TOOLS, reason="needs a Moses build: set MOSES_HOME (bin/extractor, mert, kbmira)"
)


def invoke(*args):
    return CliRunner().invoke(cli, ["-q", *map(str, args)])


def list_lines() -> list[str]:
    return gzip.decompress(LIST.read_bytes()).decode("utf-8").splitlines(keepends=True)


def test_help():
    result = invoke("rerank-tune", "--help")
    assert result.exit_code == 0
    for option in ("--reference", "--start", "--moses-home", "--tuner", "--runs", "--seed", "-o"):
        assert option in result.output


def _edit(lines: list[str], case: str) -> tuple[list[str], int, str]:
    """The list with one defect, the line it is on and what the error says."""
    lines = list(lines)
    if case == "ids out of order":
        first_1 = next(i for i, line in enumerate(lines) if line.startswith("1 |||"))
        lines.insert(first_1 + 3, lines[0])
        return lines, first_1 + 4, "sentence id 0 after id 1"
    if case == "a missing field":
        lines[40] = lines[40].rsplit(" ||| ", 1)[0] + "\n"
        return lines, 41, "expected at least 4 fields"
    if case == "a wrong feature count":
        lines[60] = lines[60].replace(" Distortion0= 0 ", " Distortion0= 0 0 ", 1)
        return lines, 61, "the dense features are 15 values"
    if case == "a feature missing":
        lines[61] = re.sub(r" LM0= \S+", "", lines[61], count=1)
        return lines, 62, "the dense features are 13 values"
    if case == "a non-finite value":
        lines[62] = re.sub(r" LM0= \S+", " LM0= nan", lines[62], count=1)
        return lines, 63, "feature LM0 has a value that is not finite"
    if case == "an id beyond the reference":
        lines[-1] = "5" + lines[-1][1:]
        return lines, len(lines), "sentence id 5 is beyond the reference"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    ["ids out of order", "a missing field", "a wrong feature count", "a feature missing",
     "a non-finite value", "an id beyond the reference"],
)  # fmt: skip
def test_bad_lists_are_one_line_naming_file_and_line_before_any_tool(tmp_path, case):
    lines, line, message = _edit(list_lines(), case)
    bad = tmp_path / "dev.nbest"
    bad.write_text("".join(lines), encoding="utf-8")
    out = tmp_path / "out" / "weights"
    out.parent.mkdir()
    # a Moses home without any tool: the list is refused before Moses is even looked for
    args = ["rerank-tune", bad, "--reference", REFERENCE, "--moses-home", tmp_path, "-o", out]
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    [error] = result.output.splitlines()
    assert error.startswith(f"phrasescore: error: {bad}:{line}: "), error
    assert message in error
    assert list(out.parent.iterdir()) == []


def test_without_moses_one_line_and_no_output(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_HOME", raising=False)
    monkeypatch.delenv("MOSES", raising=False)
    out = tmp_path / "weights"
    result = invoke("rerank-tune", LIST, "--reference", REFERENCE, "-o", out)
    assert result.exit_code == 1
    [error] = result.output.splitlines()
    assert "Moses not found: set MOSES_HOME" in error and "bin/extractor, bin/mert" in error
    result = invoke(
        "rerank-tune", LIST, "--reference", REFERENCE, "--moses-home", tmp_path, "-o", out
    )
    assert result.exit_code == 1 and "lacks bin/extractor" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("flags", "why"),
    [(["--start", INI, "--tuner", "kbmira"], "kbmira moves every weight"),
     ([], "give --start and --tuner mert")],
)  # fmt: skip
def test_tune_new_needs_a_start_and_mert_and_says_so_before_any_tool(tmp_path, flags, why):
    out = tmp_path / "weights"
    args = ["rerank-tune", LIST, "--reference", REFERENCE, "--tune", "new", *flags]
    result = invoke(*args, "--moses-home", tmp_path, "-o", out)
    assert result.exit_code == 1
    [error] = result.output.splitlines()
    assert (
        error.startswith("phrasescore: error: --tune new keeps --start's weights") and why in error
    )
    assert list(tmp_path.iterdir()) == []


def test_the_output_never_overwrites_an_input(tmp_path):
    reference = tmp_path / "ref.fr"
    reference.write_bytes(REFERENCE.read_bytes())
    result = invoke("rerank-tune", LIST, "--reference", reference, "-o", reference)
    assert result.exit_code == 1 and "is the --reference" in result.output
    assert reference.read_bytes() == REFERENCE.read_bytes()


# ---------------------------------------------------------------------------- with Moses
@pytest.fixture(scope="module")
def scored_list(tmp_path_factory, tiny_model_path, tiny_inverse_model_path) -> Path:
    """The shipped list with two model features (one nbest call)."""
    out = tmp_path_factory.mktemp("scored") / "dev.scored.nbest"
    result = invoke("nbest", LIST, "--source", SOURCE, "-m", f"L2R={tiny_model_path}",
                    "--inverse-model", f"Inv={tiny_inverse_model_path}", "-o", out, "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def ab_step_weights(tmp_path: Path, scored: Path, tuner: str, seed: int) -> bytes:
    """What ``ab --rerank``'s step (:class:`RerankStep`) tunes on ``scored`` from the ini's
    weights: the weights file it writes."""
    from phrasescore.jobs.moses_install import MosesInstall
    from phrasescore.jobs.tuning.ab_rerank import RerankStep
    from phrasescore.jobs.tuning.moses_tools import Programs
    from phrasescore.moses.nbest import read_weights

    moses = MosesInstall.find(MOSES_HOME, needs=["extractor", tuner])
    step = RerankStep((), tuner, 20, 1, moses.program, Programs().run)
    run_dir = tmp_path / "ab-run"
    (run_dir / "scored").mkdir(parents=True)
    # the step's own scored dev list: the one given (RerankStep with no models scores nothing)
    cached = step.scored_list(run_dir, "dev")
    cached.write_bytes(scored.read_bytes())
    tuned = step.tune(run_dir, lambda: cached, (SOURCE, REFERENCE), seed, read_weights(str(INI)))
    return tuned.read_bytes()


@needs_moses
@pytest.mark.parametrize("tuner", ["mert", "kbmira"])
def test_rerank_tune_gives_the_weights_of_ab_reranks_step(tmp_path, scored_list, tuner):
    out = tmp_path / "rerank.weights"
    result = invoke("rerank-tune", scored_list, "--reference", REFERENCE, "--start", INI,
                    "--tuner", tuner, "--seed", 1234, "--moses-home", MOSES_HOME, "-o", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == ab_step_weights(tmp_path, scored_list, tuner, 1234)
    assert {line.split("=")[0] for line in out.read_text().splitlines()} >= {"LM0", "L2R", "Inv"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rerank.weights")]


@needs_moses
def test_runs_report_every_dev_bleu_keep_the_best_and_apply_to_it(tmp_path, scored_list):
    out = tmp_path / "rerank.weights"
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", "rerank-tune", str(scored_list), "--reference",
         str(REFERENCE), "--start", str(INI), "--runs", "3", "--seed", "7", "--restarts", "5",
         "--workdir", str(work), "-o", str(out)],
        capture_output=True, text=True, env={**os.environ, "MOSES_HOME": MOSES_HOME},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    runs = dict(re.findall(r"  seed (\d+): dev BLEU (\d+\.\d+)", proc.stderr))
    assert sorted(runs) == ["7", "8", "9"]
    [kept] = re.findall(
        r"  seed (\d+): dev BLEU \S+  <- kept \(the best dev BLEU of 3 runs\)", proc.stderr
    )
    assert float(runs[kept]) == max(map(float, runs.values()))
    [bands] = re.findall(r"with them, the best hypothesis of 5 sentences is (.*)", proc.stderr)
    counts = re.findall(r"for (\d+)", bands)
    assert len(counts) == 3 and sum(map(int, counts)) == 5, bands
    # each run's BLEU is mert's own on the fixed list (its best point)
    for seed, bleu in runs.items():
        best = (work / f"mert-{seed}" / "mert.log").read_text()
        merts = float(re.search(r"Best point:.*=> (\S+)", best).group(1))
        assert float(bleu) == pytest.approx(100 * merts, abs=0.01)
    # the weights kept, applied by nbest --weights --one-best without a model: that BLEU
    best = tmp_path / "best.fr"
    result = invoke("nbest", scored_list, "--source", SOURCE, "--weights", out, "--one-best",
                    "-o", best, "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    references = REFERENCE.read_text(encoding="utf-8").splitlines()
    hyps = best.read_text(encoding="utf-8").splitlines()
    assert BLEU(tokenize="none").corpus_score(hyps, [references]).score == pytest.approx(
        float(runs[kept]), abs=0.01
    )


@needs_moses
def test_tune_new_keeps_the_start_weights_and_moves_only_the_models(tmp_path, scored_list):
    """--tune new: every weight of --start written back unchanged, the models' weights tuned
    (not all 0 on this list); on the unscored list (every feature weighed) one error line."""
    from phrasescore.moses.nbest import read_weights

    out = tmp_path / "rerank.weights"
    result = invoke("rerank-tune", scored_list, "--reference", REFERENCE, "--start", INI,
                    "--tune", "new", "--moses-home", MOSES_HOME, "-o", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "(only L2R, Inv; --start's weights kept)" in result.output
    tuned, start = read_weights(str(out)), read_weights(str(INI))
    kept = set(tuned) - {"L2R", "Inv"}
    assert {"L2R", "Inv"} <= set(tuned) and {"LM0", "TranslationModel0"} <= kept <= set(start)
    for name in kept:
        assert tuned[name] == pytest.approx(start[name], abs=1e-6), name
    assert any(tuned["L2R"] + tuned["Inv"])

    unscored = tmp_path / "list.nbest.gz"
    unscored.write_bytes(LIST.read_bytes())
    result = invoke("rerank-tune", unscored, "--reference", REFERENCE, "--start", INI,
                    "--tune", "new", "--moses-home", MOSES_HOME, "-o", out)  # fmt: skip
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert errors == [
        f"phrasescore: error: {unscored}: --tune new: --start weighs every feature of the list: "
        "there is nothing to tune (score the list with the models first, or give --tune all)"
    ]


@needs_moses
def test_a_failing_tool_is_one_line_and_leaves_no_output(tmp_path, scored_list):
    """A tuner that fails (a stand-in mert that exits 3, beside the real extractor): one line
    naming its log, nothing under the output name, the tools' files kept for that log."""
    home = tmp_path / "moses"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "extractor").symlink_to(Path(MOSES_HOME, "bin", "extractor"))
    (home / "bin" / "mert").write_text("#!/bin/sh\necho 'mert: out of memory' >&2\nexit 3\n")
    (home / "bin" / "mert").chmod(0o755)
    out = tmp_path / "out" / "rerank.weights"
    out.parent.mkdir()
    result = invoke("rerank-tune", scored_list, "--reference", REFERENCE, "--moses-home", home,
                    "-o", out)  # fmt: skip
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert len(errors) == 1 and "mert failed with exit code 3; see" in errors[0], result.output
    assert not out.exists()
    kept = [p for p in out.parent.iterdir()]
    assert len(kept) == 1 and kept[0].name.startswith(".rerank.weights.tune.")  # the logs


def test_the_report_says_when_the_new_features_were_all_given_0():
    """When every new feature's weight is 0, the report's last line says the dev BLEU gain is
    --start's own features retuned on the list, not the new features'."""
    from phrasescore.jobs.tuning.rerank_tune import TuneResult, TuningRun

    def report(l2r: float) -> list[str]:
        run = TuningRun(1234, 58.95, {"LM0": [0.4], "L2R": [l2r], "Inv": [0.0]})
        result = TuneResult("w", "mert", 5, 100, 57.96, [run], unweighed=["L2R", "Inv"])
        return result.lines()

    assert report(0.0)[-1] == (
        "phrasescore: the weights of L2R, Inv (not in --start) are all 0: the dev BLEU gain is "
        "--start's own features retuned on this list, not theirs"
    )
    assert report(0.1)[-1] == "phrasescore: weights -> w"
    run = TuningRun(1234, 57.96, {"LM0": [0.4], "L2R": [0.0], "Inv": [0.0]})
    only = TuneResult(
        "w", "mert", 5, 100, 57.96, [run], unweighed=["L2R", "Inv"], moved=["L2R", "Inv"]
    )
    assert "tuned by mert (only L2R, Inv; --start's weights kept):" in only.lines()[0]
    assert only.lines()[-1] == (
        "phrasescore: the weights of L2R, Inv (not in --start) are all 0: re-ranking keeps the "
        "list's own best"
    )


def test_the_report_says_where_in_the_lists_the_best_hypotheses_lie(tmp_path):
    """Each sentence's best hypothesis under the weights, and its place in the list as the
    decoder wrote it, counted in the report's bands (many from the end of the lists: longer
    lists may hold better ones)."""
    from phrasescore.jobs.tuning.rerank_tune import Choices, best_hypotheses

    lines = list_lines()
    plain = tmp_path / "list.nbest"
    plain.write_text("".join(lines), encoding="utf-8")
    weights, name = {}, None  # every feature of the list at 0, but the language model's
    for token in lines[0].split(" ||| ")[2].split():
        if token.endswith("="):
            name = token[:-1]
            weights[name] = []
        else:
            weights[name].append(1.0 if name == "LM0" else 0.0)
    choices = best_hypotheses(str(plain), 5, weights)
    places, best, seen = [], [], {}
    for line in lines:  # the highest LM0 score of each id, the first listed on a tie
        sentence, hypothesis, features = line.split(" ||| ")[:3]
        lm = float(features.split("LM0= ")[1].split()[0])
        place = seen.setdefault(sentence, [])
        place.append((lm, hypothesis.strip()))
    for hypotheses in seen.values():
        top = max(range(len(hypotheses)), key=lambda k: (hypotheses[k][0], -k))
        places.append(top)
        best.append(hypotheses[top][1])
    assert choices.places == places and choices.hypotheses == best
    assert choices.size == max(len(h) for h in seen.values()) == 100
    assert places != [0] * 5  # the language model alone does not pick the decoder's best
    made = Choices([""] * 6, [0, 0, 3, 60, 95, 99], 100)
    assert made.places_line() == (
        "the best hypothesis of 6 sentences is the list's first for 2, at places 2-50 for 1, "
        "51-100 for 3 (91-100: 2)"
    )
    assert Choices([""] * 2, [0, 1], 2).places_line() == (
        "the best hypothesis of 2 sentences is the list's first for 1"
    )
