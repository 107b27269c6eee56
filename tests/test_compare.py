"""``phrasescore compare``: top targets side by side, proposals, scatter plot, rank correlations."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from phrasescore.bundle import load_model
from phrasescore.cli import cli
from phrasescore.jobs.analysis.compare import CompareOptions, compare, rank_average, spearman
from phrasescore.moses.phrase_table import read_phrase_table

from .conftest import TEXT, write_lines

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE = str(TEXT / "multi30k-phrase-table-sample.gz")


def table_targets() -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    for e in read_phrase_table(TABLE):
        out.setdefault(e.source, {})[e.target] = [float(s) for s in e.scores]
    return out


def test_cli_prints_both_rankings_correlations_and_writes_the_scatter(tiny_model_path, tmp_path):
    scatter = tmp_path / "fig3.png"
    result = CliRunner().invoke(
        cli,
        ["-q", "compare", TABLE, "-m", tiny_model_path, "--sample", "2", "--min-targets", "4"]
        + ["--top", "3", "--scatter", str(scatter)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert scatter.read_bytes()[:8] == PNG_MAGIC
    out = result.output
    assert out.count("### ") == 2
    assert "| # | by table φ(e\\|f) | φ(e\\|f) | by model | log p |" in out
    for name in ("φ(f|e)", "lex(f|e)", "φ(e|f)", "lex(e|f)"):
        assert re.search(rf"column \d {re.escape(name)}: [+-]\d\.\d{{3}}", out)
    assert "(200 of 200 pairs)" in out


def test_rankings_by_table_and_by_model(tiny_model_path):
    model = load_model(tiny_model_path)
    options = CompareOptions(sample=3, min_targets=4, top=3)
    result = compare(TABLE, None, options, model=model)
    targets = table_targets()
    assert len(result.comparisons) == 3
    for comp in result.comparisons:
        rows = targets[comp.source]
        assert comp.n_targets == len(rows) >= 4
        phis = sorted((s[2] for s in rows.values()), reverse=True)[:3]
        assert [c.table_score for c in comp.by_table] == phis  # φ(e|f), the 3rd column
        logps = [c.logprob for c in comp.by_model]
        assert logps == sorted(logps, reverse=True)
        assert max(c.logprob for c in comp.by_table) <= logps[0] + 1e-9
        assert {c.target for c in comp.by_model} <= set(rows)


def test_given_sources_and_proposals(tiny_model_path, tmp_path):
    model = load_model(tiny_model_path)
    targets = table_targets()
    chosen = ["a &amp; amp ; m", "farmer &apos;s"]
    sources = write_lines(tmp_path / "sources", chosen + ["not in the table"])
    options = CompareOptions(sources_path=sources, top=4, proposals=30, max_pairs=50)
    result = compare(TABLE, None, options, model=model)
    assert [c.source for c in result.comparisons] == chosen
    assert result.pairs == 50 and len(result.correlations) == 4
    for comp in result.comparisons:
        assert 0 < len(comp.proposals) <= 4
        for proposal in comp.proposals:
            assert proposal.in_table == (proposal.target in targets[comp.source])
            assert proposal.target and proposal.logprob < 0


def test_spearman_without_scipy_equals_scipy(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = np.round(x + rng.normal(size=200), 1)  # with ties
    with_scipy = spearman(x, y)
    import builtins

    real_import = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    assert spearman(x, y) == pytest.approx(with_scipy, abs=1e-12)
    assert list(rank_average(np.array([3.0, 1.0, 3.0, 2.0]))) == [3.5, 1.0, 3.5, 2.0]
    assert np.isnan(spearman(x, np.ones(200)))


def test_many_pairs_are_drawn_as_a_density(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setattr("phrasescore.jobs.analysis.compare.HEXBIN_ABOVE", 10)
    options = CompareOptions(sample=0, scatter_path=str(tmp_path / "d.png"))
    result = compare(TABLE, None, options, model=load_model(tiny_model_path))
    assert (tmp_path / "d.png").read_bytes()[:8] == PNG_MAGIC
    assert result.comparisons == [] and -1.0 <= result.length_spearman <= 1.0
