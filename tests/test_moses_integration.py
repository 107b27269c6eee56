"""phrasescore against a real Moses build (skipped unless MOSES_HOME names one).

A small real system (tests/data/moses-system: 21,605 lines of the Multi30k en->fr table, 50 dev
and 20 test sentences) with a 5-gram KenLM built by Moses' own lmplz: Moses loads the table and
the ini that ``rescore --moses-ini`` writes, unedited, and every hypothesis carries the fifth
TranslationModel0 score; then the ``ab`` job runs a short MERT (2 iterations) per system.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from phrasescore.errors import InputError

from .conftest import run_cli

MOSES_HOME = os.environ.get("MOSES_HOME")
pytestmark = pytest.mark.skipif(
    not MOSES_HOME or not Path(MOSES_HOME, "bin", "moses").is_file(),
    reason="needs a Moses build: set MOSES_HOME (bin/moses, bin/lmplz, scripts/)",
)

SYSTEM = Path(__file__).parent / "data" / "moses-system"
FRENCH = Path(__file__).parent.parent / "examples" / "corpus" / "train.tok.lc.fr.gz"

BASELINE_INI = """\
[input-factors]
0

[mapping]
0 T 0

[distortion-limit]
6

[feature]
UnknownWordPenalty
WordPenalty
PhrasePenalty
PhraseDictionaryMemory name=TranslationModel0 num-features=4 path={table} input-factor=0 output-factor=0
Distortion
KENLM name=LM0 factor=0 path={lm} order=5

[weight]
UnknownWordPenalty0= 1
WordPenalty0= -1
PhrasePenalty0= 0.2
TranslationModel0= 0.2 0.2 0.2 0.2
Distortion0= 0.3
LM0= 0.5
"""


def _phrasescore(*args: str) -> subprocess.CompletedProcess:
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def moses_system(tmp_path_factory, tiny_model_path) -> dict[str, Path]:
    """Baseline and rescored inis of the small system, with a KenLM built by lmplz."""
    folder = tmp_path_factory.mktemp("moses-system")
    lm = folder / "lm.fr.arpa"
    with open(lm, "wb") as arpa:
        zcat = subprocess.Popen(["gzip", "-dc", str(FRENCH)], stdout=subprocess.PIPE)
        subprocess.run(
            [str(Path(MOSES_HOME, "bin", "lmplz")), "-o", "5", "-S", "10%", "-T", str(folder)],
            stdin=zcat.stdout,
            stdout=arpa,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        zcat.wait()
    table = folder / "phrase-table.gz"
    shutil.copy(SYSTEM / "phrase-table.gz", table)
    baseline = folder / "moses.ini"
    baseline.write_text(BASELINE_INI.format(table=table, lm=lm), encoding="utf-8")
    rescored = folder / "moses.rescored.ini"
    _phrasescore(
        "rescore",
        str(table),
        "-m",
        tiny_model_path,
        "-o",
        str(folder / "pt.rescored.gz"),
        "--moses-ini",
        str(baseline),
        "--ini-out",
        str(rescored),
        "--threads",
        "1",
    )
    return {"baseline": baseline, "rescored": rescored, "dir": folder}


def test_moses_loads_the_rescored_table_and_ini_and_uses_five_scores(moses_system, tmp_path):
    nbest = tmp_path / "out.nbest"
    proc = subprocess.run(
        [
            str(Path(MOSES_HOME, "bin", "moses")),
            "-f",
            str(moses_system["rescored"]),
            "-threads",
            "1",
            "-n-best-list",
            str(nbest),
            "3",
        ],
        stdin=open(SYSTEM / "test20.en", "rb"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == 20
    lines = nbest.read_text(encoding="utf-8").splitlines()
    assert {int(line.split(" ||| ")[0]) for line in lines} == set(range(20))
    for line in lines:
        features = line.split(" ||| ")[2]
        scores = re.search(r"TranslationModel0= ((?:\S+ ?)+?)(?: [A-Za-z]\w*=|$)", features)
        values = [float(v) for v in scores.group(1).split()]
        assert len(values) == 5, line
        # the new column holds a probability: Moses logs it, so its feature value is <= 0
        assert values[4] <= 0.0


def test_ab_runs_a_short_mert_per_system_and_resumes(moses_system, tmp_path):
    from phrasescore.jobs.tuning.ab import ComparisonOptions, compare_systems, format_report

    options = ComparisonOptions(runs=2, jobs=2, max_iterations=2, bootstrap_samples=200)
    args = dict(
        baseline=str(moses_system["baseline"]),
        candidates=[f"rnn={moses_system['rescored']}"],
        dev=(str(SYSTEM / "dev50.en"), str(SYSTEM / "dev50.fr")),
        tests=[("test20", str(SYSTEM / "test20.en"), str(SYSTEM / "test20.fr"))],
        workdir=str(tmp_path / "ab"),
        moses_home=MOSES_HOME,
        options=options,
    )
    results = compare_systems(**args)
    assert [r.system.name for r in results] == ["baseline", "rnn"]
    for result in results:
        assert [run.seed for run in result.runs] == [1234, 5678]
        for run in result.runs:
            assert 0.0 < run.bleu["test20"] <= 100.0
    # the tuned weight of the new column, one per run; the baseline has none
    assert results[0].new_weights == {}
    assert list(results[1].new_weights) == ["TranslationModel0[4]"]
    assert len(results[1].new_weights["TranslationModel0[4]"]) == 2
    assert 0.0 <= results[1].p_values["test20"] <= 1.0
    report = format_report(results, ["test20"])
    assert len(report) == 3 and report[2].startswith("rnn")
    # each run's dev BLEU is the best point of mert-moses.pl's last iteration
    for result in results:
        for run in result.runs:
            log = tmp_path / "ab" / result.system.name / f"mert-{run.seed}" / "run2.mert.log"
            best = log.read_bytes().rsplit(b"Best point:", 1)[1].split(b"=>")[1].split()[0]
            assert run.dev_bleu == pytest.approx(100 * float(best))
    assert f"{results[1].runs[0].dev_bleu:.2f} / {results[1].runs[1].dev_bleu:.2f}" in report[2]
    # the tables were filtered once per system, and each MERT run reused that filtered model
    for name in ("baseline", "rnn"):
        assert (tmp_path / "ab" / name / "filtered" / "moses.ini").is_file()
        for seed in (1234, 5678):
            assert (tmp_path / "ab" / name / f"mert-{seed}" / "filtered").is_symlink()
    # a second call finds every step done: same figures, nothing run again
    stamp = (tmp_path / "ab" / "rnn" / "mert-1234" / "test20.out").stat().st_mtime_ns
    again = compare_systems(**args)
    assert format_report(again, ["test20"]) == report
    assert (tmp_path / "ab" / "rnn" / "mert-1234" / "test20.out").stat().st_mtime_ns == stamp


def rerank_baseline(
    moses_system, workdir, rerank, rerank_inverse=(), tuner="mert", tune="all", **more
):
    """``ab --rerank`` of the test system's baseline alone: 1 MERT run of 1 iteration on 50 dev
    sentences, 10-best lists, one test set of 20 sentences (``more``: other options)."""
    from phrasescore.jobs.tuning.ab import ComparisonOptions, compare_systems

    options = ComparisonOptions(runs=1, jobs=1, max_iterations=1, nbest_size=10)
    options.bootstrap_samples = 100
    options.rerank_tuner = tuner
    options.rerank_tune = tune
    sets = more.pop("rerank_sets", None)
    for name, value in more.items():
        setattr(options, name, value)
    return compare_systems(
        baseline=str(moses_system["baseline"]),
        candidates=[],
        dev=(str(SYSTEM / "dev50.en"), str(SYSTEM / "dev50.fr")),
        tests=[("test20", str(SYSTEM / "test20.en"), str(SYSTEM / "test20.fr"))],
        workdir=str(workdir),
        moses_home=MOSES_HOME,
        options=options,
        rerank=rerank,
        rerank_inverse=list(rerank_inverse),
        rerank_sets=sets,
    )


def test_ab_rerank_tunes_the_nbest_feature_on_dev_and_reranks_the_tests(
    moses_system, tiny_model_path, tmp_path
):
    from click.testing import CliRunner

    from phrasescore.cli import cli
    from phrasescore.jobs.tuning.ab import format_report
    from phrasescore.jobs.tuning.rerank_tune import dev_bleu
    from phrasescore.moses.nbest import read_nbest

    results = rerank_baseline(moses_system, tmp_path / "ab", [f"Sent0={tiny_model_path}"])
    assert [r.system.name for r in results] == ["baseline", "baseline+rerank"]
    reranked = results[1]
    (run,) = reranked.runs
    # every re-ranked test line is one of that sentence's n-best hypotheses
    run_dir = tmp_path / "ab" / "baseline" / "mert-1234"
    groups: dict[int, set[str]] = {}
    listed = set()
    for entry in read_nbest(str(run_dir / "test20.10best.nbest")):
        groups.setdefault(entry.id, set()).add(entry.hypothesis)
        listed.update(name for name, _ in entry.parsed_features())
    # the re-ranking weights: every feature of the lists and the new one, tuned by mert (L1 = 1)
    assert list(reranked.new_weights) == ["Sent0[0]"]
    assert set(run.weights) == listed | {"Sent0"}
    assert abs(sum(abs(w) for ws in run.weights.values() for w in ws) - 1.0) < 1e-4
    output = run.outputs["test20"].read_text(encoding="utf-8").splitlines()
    assert len(output) == 20
    for index, line in enumerate(output):
        assert line in groups[index]
    assert 0.0 <= reranked.p_values["test20"] <= 1.0
    assert format_report(results, ["test20"])[2].startswith("baseline+rerank")
    # its dev BLEU: the dev list re-ranked with the tuned weights, the BLEU mert reached there
    rerank_log = next(run_dir.glob("rerank-*Sent0-*/mert.log")).read_bytes()
    best = rerank_log.rsplit(b"Best point:", 1)[1].split(b"=>")[1].split()[0]
    assert run.dev_bleu == pytest.approx(100 * float(best), abs=0.01)
    # held out: each half of the 50 dev sentences tuned on the other half's 25 alone ...
    set_dir = next(run_dir.glob("rerank-*Sent0-*"))
    scored_dev = next(run_dir.glob("scored/dev.*.nbest"))
    dev_entries = list(read_nbest(str(scored_dev)))
    references = (SYSTEM / "dev50.fr").read_text(encoding="utf-8").splitlines()
    for fold, others in ((0, range(25, 50)), (1, range(25))):
        part = set_dir / "heldout-2" / f"fold-{fold}"
        tuned_on = list(read_nbest(str(part / "tune.nbest")))
        expected = [e for e in dev_entries if e.id in others]
        assert [e.id for e in tuned_on] == [e.id - others[0] for e in expected]
        assert [e.line().split("|||", 1)[1] for e in tuned_on] == [
            e.line().split("|||", 1)[1] for e in expected
        ]
        assert (part / "tune.ref").read_text(encoding="utf-8").splitlines() == [
            references[i] for i in others
        ]
    # ... and each half's 1-best chosen by the other half's weights, as `nbest --weights` does
    halves = []
    for fold, part in ((0, slice(0, 25)), (1, slice(25, 50))):
        weights = set_dir / "heldout-2" / f"fold-{fold}" / "weights.ini"
        result = CliRunner().invoke(
            cli,
            ["-q", "nbest", str(scored_dev), "--source", str(SYSTEM / "dev50.en")]
            + ["--weights", str(weights), "--one-best"],
        )
        assert result.exit_code == 0, result.output
        halves += result.stdout.splitlines()[part]
    assert run.heldout_dev_bleu == pytest.approx(dev_bleu(halves, references), abs=1e-9)
    report = format_report(results, ["test20"])
    assert "dev held out per run" in report[0]
    assert report[1].rstrip().endswith("-") and f"{run.heldout_dev_bleu:.2f}" in report[2]
    # a second call tunes no fold again
    stamp = (set_dir / "heldout-2" / "fold-0" / "weights.ini").stat().st_mtime_ns
    again = rerank_baseline(moses_system, tmp_path / "ab", [f"Sent0={tiny_model_path}"])
    assert again[1].runs[0].heldout_dev_bleu == run.heldout_dev_bleu
    assert (set_dir / "heldout-2" / "fold-0" / "weights.ini").stat().st_mtime_ns == stamp


def test_ab_rerank_tune_new_keeps_the_runs_mert_weights_and_tunes_the_model(
    moses_system, tiny_model_path, tmp_path
):
    """``--rerank-tune new``: a system of its own, every weight of the MERT run kept as MERT
    tuned it, the model's weight tuned; 20 re-ranked test lines."""
    results = rerank_baseline(
        moses_system, tmp_path / "ab", [f"Sent0={tiny_model_path}"], tune="new"
    )
    assert [r.system.name for r in results] == ["baseline", "baseline+rerank-new"]
    (tuned,), (run,) = results[0].runs, results[1].runs
    kept = set(run.weights) - {"Sent0"}
    assert "Sent0" in run.weights and {"LM0", "TranslationModel0"} <= kept <= set(tuned.weights)
    for name in kept:
        assert run.weights[name] == pytest.approx(tuned.weights[name], abs=1e-6), name
    assert len(run.outputs["test20"].read_text(encoding="utf-8").splitlines()) == 20


def test_ab_rerank_with_an_inverse_model_and_kbmira_reuses_the_scored_lists(
    moses_system, tiny_model_path, tiny_inverse_model_path, tmp_path
):
    """Two sets of re-ranking models in one workdir, the second adding a target->source model
    and tuned with kbmira: the dev and test lists scored by the first model are not scored
    again (the second scores its own model alone and joins the two)."""
    rerank_baseline(moses_system, tmp_path / "ab", [f"Sent0={tiny_model_path}"])
    scored = tmp_path / "ab" / "baseline" / "mert-1234" / "scored"
    first = {p.name: p.stat().st_mtime_ns for p in scored.iterdir()}
    assert len(first) == 2  # dev and test scored by Sent0 (the test list re-ranked from it)
    results = rerank_baseline(
        moses_system,
        tmp_path / "ab",
        [f"Sent0={tiny_model_path}"],
        [f"Inv={tiny_inverse_model_path}"],
        tuner="kbmira",
    )
    assert [r.system.name for r in results] == ["baseline", "baseline+rerank-kbmira"]
    now = {p.name: p.stat().st_mtime_ns for p in scored.iterdir()}
    # + dev and test by Inv alone, and by both (their features joined)
    assert {k: now[k] for k in first} == first and len(now) == 6
    (run,) = results[1].runs
    assert list(results[1].new_weights) == ["Sent0[0]", "Inv[0]"]
    assert abs(sum(abs(w) for ws in run.weights.values() for w in ws) - 1.0) < 1e-4
    assert len(run.outputs["test20"].read_text(encoding="utf-8").splitlines()) == 20


def test_each_way_of_tuning_holds_out_dev_with_its_own_tuner_in_a_shared_workdir(
    moses_system, tiny_model_path, tmp_path
):
    """The same model tuned with mert, then with kbmira in the same workdir: the kbmira
    system's held-out dev is tuned by kbmira on each half (not mert's halves read back), the
    figure of a workdir where kbmira was alone."""
    model = [f"Sent0={tiny_model_path}"]
    mert = rerank_baseline(moses_system, tmp_path / "ab", model)[1].runs[0]
    kbmira = rerank_baseline(moses_system, tmp_path / "ab", model, tuner="kbmira")[1].runs[0]
    set_dir = next((tmp_path / "ab" / "baseline" / "mert-1234").glob("rerank-*Sent0-*"))
    for fold in (0, 1):
        assert (set_dir / "heldout-2" / f"fold-{fold}" / "mert.log").exists()
        assert (set_dir / "heldout-2-kbmira" / f"fold-{fold}" / "kbmira.log").exists()
    alone = rerank_baseline(moses_system, tmp_path / "alone", model, tuner="kbmira")[1].runs[0]
    assert kbmira.heldout_dev_bleu == alone.heldout_dev_bleu
    assert mert.heldout_dev_bleu is not None and kbmira.heldout_dev_bleu is not None


def test_ab_rerank_sets_are_systems_of_their_own_on_the_same_lists(
    moses_system, tiny_model_path, tiny_inverse_model_path, tmp_path
):
    """Two --rerank-set in one call: each a system with its own tuned weights, the features it
    names and no other; each model's lists scored once for both; the p-values against the
    first set's system (the baseline's too); the first set's run the same as a workdir where
    that set was alone."""
    from phrasescore.jobs.tuning.ab import format_report

    models = ([f"Sent0={tiny_model_path}"], [f"Inv={tiny_inverse_model_path}"])
    sets = ["one=Sent0", "both=Sent0,Inv"]
    results = rerank_baseline(
        moses_system, tmp_path / "ab", *models, rerank_sets=sets, against="baseline+one"
    )
    names = [r.system.name for r in results]
    assert names == ["baseline", "baseline+one", "baseline+both"]
    one, both = results[1], results[2]
    assert list(one.new_weights) == ["Sent0[0]"] and "Inv" not in one.runs[0].weights
    assert list(both.new_weights) == ["Sent0[0]", "Inv[0]"]
    assert set(results[0].p_values) == {"test20"} and not one.p_values
    assert 0.0 <= both.p_values["test20"] <= 1.0
    assert "p (test20 vs baseline+one)" in format_report(results, ["test20"], "baseline+one")[0]
    run_dir = tmp_path / "ab" / "baseline" / "mert-1234"
    scoring_logs = sorted(p.name for p in run_dir.glob("rerank-*/*.log") if "nbest" in p.name)
    # dev and test20 scored by Sent0 once and by Inv once (the sets' lists joined from them)
    assert len(scoring_logs) == 4, scoring_logs
    alone = rerank_baseline(moses_system, tmp_path / "alone", [f"Sent0={tiny_model_path}"])[1]
    assert alone.runs[0].weights == one.runs[0].weights
    assert (
        alone.runs[0].outputs["test20"].read_bytes() == one.runs[0].outputs["test20"].read_bytes()
    )
    with pytest.raises(InputError, match=r"--against nosuch: no such system \(systems: "
                       r"baseline, baseline\+one, baseline\+both\)"):  # fmt: skip
        rerank_baseline(moses_system, tmp_path / "ab", *models, rerank_sets=sets, against="nosuch")


def test_ab_rerank_with_an_ensemble_feature_scores_the_lists_with_both_models(
    moses_system, tiny_model_path, tiny_second_seed_model_path, tmp_path
):
    """``--rerank Ens=A,B``: one feature, one tuned weight, its values the ensemble's."""
    import numpy as np

    from phrasescore.bundle import load_model
    from phrasescore.engine.scoring import EnsembleScorer, PairScorer
    from phrasescore.moses.nbest import read_nbest

    models = f"{tiny_model_path},{tiny_second_seed_model_path}"
    results = rerank_baseline(moses_system, tmp_path / "ab", [f"Ens={models}"])
    assert list(results[1].new_weights) == ["Ens[0]"]
    lists = sorted((tmp_path / "ab" / "baseline" / "mert-1234" / "scored").iterdir())
    assert [p.name.split(".")[0] for p in lists] == ["dev", "test20"]
    entries = list(read_nbest(str(lists[0])))
    sources = (SYSTEM / "dev50.en").read_text(encoding="utf-8").splitlines()
    scorer = EnsembleScorer(
        [PairScorer(load_model(p)) for p in (tiny_model_path, tiny_second_seed_model_path)]
    )
    expected = scorer.score_phrases(
        [sources[e.id] for e in entries], [e.hypothesis for e in entries]
    )
    values = [dict(e.parsed_features())["Ens"][0] for e in entries]
    np.testing.assert_allclose(values, expected.logprob, rtol=1e-5, atol=1e-4)
