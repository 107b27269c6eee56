"""phrasescore.jobs.tuning.ab_rerank against files Moses' own extractor and mert wrote (tests/data/nbest)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from phrasescore.errors import InputError
from phrasescore.moses.ini import read_weights
from phrasescore.moses.nbest import iter_nbest_groups, read_nbest, total_score
from phrasescore.moses.tuning import (
    dense_feature_names,
    read_kbmira_weights,
    read_tuned_weights,
    weight_vector,
    weights_by_feature,
    write_start_point,
    write_weights_file,
)

DATA = Path(__file__).parent / "data"
NBEST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
REFERENCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.fr"
MERT = DATA / "nbest" / "mert"


def reranked_bleu(weights: dict[str, list[float]]) -> float:
    """BLEU of the list's best hypotheses under ``weights`` (ties: the first listed)."""
    best = []
    for group in iter_nbest_groups(read_nbest(str(NBEST))):
        totals = [total_score(entry.parsed_features(), weights) for entry in group]
        best.append(group[max(range(len(group)), key=lambda i: (totals[i], -i))].hypothesis)
    references = REFERENCE.read_text(encoding="utf-8").splitlines()
    return BLEU(tokenize="none").corpus_score(best, [references]).score


def test_dense_names_are_the_lists_features_in_order():
    names = dense_feature_names(MERT / "features.dat")
    first = next(read_nbest(str(NBEST)))
    expected = [
        f"{name}_{i}" for name, values in first.parsed_features() for i in range(len(values))
    ]
    assert names == expected and len(names) == 14


def test_start_point_is_the_ini_weights_in_extractor_order(tmp_path):
    names = dense_feature_names(MERT / "features.dat")
    ini = read_weights((DATA / "moses" / "multi30k.moses.ini").read_text(encoding="utf-8"))
    start = weight_vector(names, ini, 0.0)
    assert start[names.index("LM0_0")] == 0.5 and start[names.index("WordPenalty0_0")] == -1.0
    write_start_point(tmp_path / "init.opt", start)
    assert (tmp_path / "init.opt").read_bytes() == (MERT / "init.opt").read_bytes()
    # a feature the ini lacks (a new n-best feature) starts at the default
    assert weight_vector(["RNNEncDec0_0", "LM0_0"], ini, 0.0) == [0.0, 0.5]


def test_mert_weights_rerank_the_list_to_merts_own_bleu(tmp_path):
    names = dense_feature_names(MERT / "features.dat")
    weights = read_tuned_weights(MERT / "weights.txt", names)
    assert list(weights) == [
        "LexicalReordering0",
        "Distortion0",
        "LM0",
        "WordPenalty0",
        "PhrasePenalty0",
        "TranslationModel0",
    ]
    assert len(weights["TranslationModel0"]) == 4
    bleu = reranked_bleu(weights)
    merts = float((MERT / "mert.best-point.txt").read_text().split("=>")[1])
    assert bleu == pytest.approx(100 * merts, abs=1e-4)  # 76.8998
    # the weights file phrasescore writes reads back as the same weights
    write_weights_file(tmp_path / "w.ini", weights)
    assert read_weights((tmp_path / "w.ini").read_text(encoding="utf-8")) == weights


def test_kbmira_weights_rerank_the_list_to_kbmiras_own_bleu():
    """kbmira names its dense weights F0 .. in feature order; phrasescore maps them back to the
    features (L1-normalised as mert's) and re-ranks the list to the BLEU kbmira reports."""
    names = dense_feature_names(MERT / "features.dat")
    weights = read_kbmira_weights(MERT / "kbmira.out", names)
    assert list(weights) == list(read_tuned_weights(MERT / "weights.txt", names))
    flat = [w for values in weights.values() for w in values]
    assert sum(abs(w) for w in flat) == pytest.approx(1.0)
    assert weights["WordPenalty0"][0] == pytest.approx(-1.0288 / 5.191627, rel=1e-5)
    bleu = reranked_bleu(weights)
    reported = float((MERT / "kbmira.best-bleu.txt").read_text().split("=")[1])
    assert bleu == pytest.approx(100 * reported, abs=1e-4)  # 67.1359, below mert's 76.8998


def test_malformed_kbmira_output_is_a_one_line_error(tmp_path):
    out = tmp_path / "mira.out"
    out.write_text("F0 0.5\nF1 x\n")
    with pytest.raises(InputError, match="not a number"):
        read_kbmira_weights(out, ["LM0_0", "WordPenalty0_0"])
    out.write_text("F0 0.5\n")
    with pytest.raises(InputError, match="kbmira gave 1 of 2 weights"):
        read_kbmira_weights(out, ["LM0_0", "WordPenalty0_0"])
    out.write_text("F0 0.5\nF7 1\n")
    with pytest.raises(InputError, match="not a dense kbmira weight"):
        read_kbmira_weights(out, ["LM0_0", "WordPenalty0_0"])


def test_malformed_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "features.dat"
    bad.write_text("1 2 3\n")
    with pytest.raises(InputError, match="no feature header"):
        dense_feature_names(bad)
    bad.write_text("FEATURES_TXT_BEGIN_0 0 1 3 LM0_0 WordPenalty0_0\n")
    with pytest.raises(InputError, match="names 2 values, expected 3"):
        dense_feature_names(bad)
    with pytest.raises(InputError, match="2 weights for 1 features"):
        (tmp_path / "w.txt").write_text("0.5 0.5 \n")
        read_tuned_weights(tmp_path / "w.txt", ["LM0_0"])
    with pytest.raises(InputError, match="out of order"):
        weights_by_feature(["LM0_1", "LM0_0"], [1.0, 2.0])


def _cli(*args: str):
    from click.testing import CliRunner

    from phrasescore.cli import cli

    return CliRunner().invoke(cli, ["-q", *args])


def test_rerank_weights_command_bridges_the_moses_files_by_hand(tmp_path):
    """The by-hand recipe of docs/moses.md: init.opt from a moses.ini, named weights from mert's
    or kbmira's output, then nbest --weights (no -m) re-ranks the list to the tuner's BLEU."""
    ini = str(DATA / "moses" / "multi30k.moses.ini")
    features = str(MERT / "features.dat")
    start = tmp_path / "init.opt"
    assert _cli("rerank-weights", features, "--start", ini, "-o", str(start)).exit_code == 0
    assert start.read_bytes() == (MERT / "init.opt").read_bytes()
    references = REFERENCE.read_text(encoding="utf-8").splitlines()
    source = str(DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en")
    for tuned, reported in (
        ("weights.txt", float((MERT / "mert.best-point.txt").read_text().split("=>")[1])),
        ("kbmira.out", float((MERT / "kbmira.best-bleu.txt").read_text().split("=")[1])),
    ):
        named = tmp_path / f"{tuned}.ini"
        result = _cli("rerank-weights", features, "--tuned", str(MERT / tuned), "-o", str(named))
        assert result.exit_code == 0, result.output
        names = dense_feature_names(MERT / "features.dat")
        assert read_weights(named.read_text(encoding="utf-8")) == (
            read_kbmira_weights(MERT / tuned, names)
            if tuned == "kbmira.out"
            else read_tuned_weights(MERT / tuned, names)
        )
        best = tmp_path / f"{tuned}.best"
        args = ["nbest", str(NBEST), "--source", source, "--weights", str(named), "--one-best"]
        result = _cli(*args, "-o", str(best), "--no-progress")
        assert result.exit_code == 0, result.output
        output = best.read_text(encoding="utf-8").splitlines()
        bleu = BLEU(tokenize="none").corpus_score(output, [references]).score
        assert bleu == pytest.approx(100 * reported, abs=1e-4)
    assert _cli("rerank-weights", features, "-o", str(tmp_path / "x")).exit_code == 1


def test_nbest_weights_without_a_model_warns_of_a_weighed_feature_the_list_lacks(tmp_path, caplog):
    ini = str(DATA / "moses" / "multi30k.moses.ini")
    source = str(DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en")
    extra = tmp_path / "w.ini"
    extra.write_text(Path(ini).read_text(encoding="utf-8") + "RNNEncDec0= 0.3\n")
    args = ["nbest", str(NBEST), "--source", source, "--weights", str(extra), "--one-best"]
    from phrasescore.jobs.nbest.nbest import NBestOptions, rescore_nbest

    options = NBestOptions(weights=str(extra), one_best=True)
    with caplog.at_level("WARNING"):
        rescore_nbest(
            str(NBEST), source, output=str(tmp_path / "o"), options=options, progress=False
        )
    assert "RNNEncDec0, which this list lacks" in caplog.text
    # the re-ranking itself is the ini's: the list's own best (its totals are the ini's)
    assert _cli(*args, "-o", str(tmp_path / "o2"), "--no-progress").exit_code == 0
    lines = (tmp_path / "o2").read_text(encoding="utf-8").splitlines()
    firsts = [group[0].hypothesis for group in iter_nbest_groups(read_nbest(str(NBEST)))]
    assert lines == firsts
