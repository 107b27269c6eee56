"""``nbest`` with several features in one pass: ``-m NAME=MODEL``,
``--inverse-model NAME=MODEL`` and ``NAME=A,B`` ensembles, on the real Moses list of
tests/data/nbest, byte-identical to one call per feature chained."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from phrasescore.cli import cli
from phrasescore.errors import InputError
from phrasescore.jobs.feature_specs import FeatureModel
from phrasescore.jobs.nbest.features import nbest_feature_models
from phrasescore.moses.nbest import join_added_features, read_nbest, read_weights

from .conftest import DATA, write_lines

NBEST = DATA / "nbest"
LIST = NBEST / "multi30k.test2016.ids0-4.100best.nbest.gz"
SOURCE = NBEST / "multi30k.test2016.head5.tok.lc.en"
INI = DATA / "moses" / "multi30k.moses.ini"


def invoke(*args: str):
    return CliRunner().invoke(cli, ["-q", *map(str, args)])


def nbest(*args, out):
    result = invoke("nbest", *args, "--source", SOURCE, "-o", out, "--no-progress")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def four(
    tiny_model_path, tiny_second_seed_model_path, tiny_r2l_model_path, tiny_inverse_model_path
):
    """Four features: a model, a right-to-left model, an ensemble and a target->source model,
    each as (NAME, chained call's flags, one-pass spec's option and value)."""
    ensemble = f"{tiny_model_path},{tiny_second_seed_model_path}"
    return [
        ("L2R", ["-m", tiny_model_path], ("-m", f"L2R={tiny_model_path}")),
        ("R2L", ["-m", tiny_r2l_model_path], ("-m", f"R2L={tiny_r2l_model_path}")),
        ("Ens", ["-m", tiny_model_path, "-m", tiny_second_seed_model_path], ("-m", f"Ens={ensemble}")),
        ("Inv", ["-m", tiny_inverse_model_path, "--inverse"], ("--inverse-model", f"Inv={tiny_inverse_model_path}")),
    ]  # fmt: skip


def weights_for(tmp_path, names) -> str:
    """The system's tuned weights and a weight for each new feature."""
    lines = [
        f"{name}= " + " ".join(map(str, values)) for name, values in read_weights(str(INI)).items()
    ]
    lines += [f"{name}= {0.1 * (k + 1)}" for k, name in enumerate(names)]
    return write_lines(tmp_path / "weights", lines)  # fmt: skip


def chained(tmp_path, four, extra_last=()) -> bytes:
    current = LIST
    for k, (name, flags, _) in enumerate(four):
        last = k == len(four) - 1
        out = tmp_path / f"chain{k}.nbest"
        current = nbest(current, *flags, "--name", name, *(extra_last if last else ()), out=out)
    return current.read_bytes()


def one_pass_args(four) -> list[str]:
    return [arg for _, _, spec in four for arg in spec]


def test_one_pass_is_byte_identical_to_one_call_per_model_chained(tmp_path, four):
    want = chained(tmp_path, four)
    got = nbest(LIST, *one_pass_args(four), out=tmp_path / "one.nbest").read_bytes()
    assert got == want
    entries = list(read_nbest(str(tmp_path / "one.nbest")))
    assert len(entries) == 324  # the whole list
    labels = [token for token in entries[0].features.split() if token.endswith("=")]
    assert labels[-4:] == ["L2R=", "R2L=", "Ens=", "Inv="]
    # the ensemble is neither of its members: a feature of its own
    values = {name: [v for n, v in e.parsed_features() if n == name][0][0] for e in entries[:1] for name in ("L2R", "Ens")}  # fmt: skip
    assert values["L2R"] != values["Ens"]
    # forked workers (three blocks of 100-150 lines, one thread each): the bytes of one
    # process of one thread (float sums in another thread count round otherwise)
    blocks = ["--chunk-lines", "100"]
    one = nbest(
        LIST, *one_pass_args(four), *blocks, "--threads", "1", out=tmp_path / "blocks.nbest"
    )
    workers = nbest(LIST, *one_pass_args(four), *blocks, "--workers", "2",
                    out=tmp_path / "workers.nbest")  # fmt: skip
    assert workers.read_bytes() == one.read_bytes()


def test_features_scored_in_lists_of_their_own_join_to_the_one_pass_list(tmp_path, four):
    """Each feature added to the list by a call of its own, the four lists joined: the bytes
    of the one call with every model; a list that is not the list with features added, or
    that ends early, is refused by its file and line."""
    want = nbest(LIST, *one_pass_args(four), out=tmp_path / "one.nbest").read_bytes()
    alone = [str(nbest(LIST, *spec, out=tmp_path / f"{name}.nbest")) for name, _, spec in four]
    assert "".join(join_added_features(str(LIST), alone)).encode() == want
    # two of them in the other order: the one call with those two models in that order
    other = nbest(LIST, *four[1][2], *four[0][2], out=tmp_path / "other.nbest").read_bytes()
    assert "".join(join_added_features(str(LIST), [alone[1], alone[0]])).encode() == other

    lines = (tmp_path / "R2L.nbest").read_text().splitlines(keepends=True)
    edited = lines[:6] + [lines[6].replace(" ||| ", " ||| a ", 1)] + lines[7:]
    for bad, where in [(edited, ":7:"), (lines[:-1], "ends before line 324")]:
        path = write_lines(tmp_path / "bad.nbest", [line.rstrip("\n") for line in bad])
        with pytest.raises(InputError) as error:
            list(join_added_features(str(LIST), [alone[0], str(path)]))
        assert "bad.nbest" in str(error.value) and where in str(error.value), str(error.value)


def test_one_pass_reranks_as_the_chain_with_weights_on_its_last_call(tmp_path, four):
    weights = weights_for(tmp_path, [name for name, _, _ in four])
    extra = ("--weights", weights, "--one-best")
    want = chained(tmp_path, four, extra_last=extra)
    got = nbest(LIST, *one_pass_args(four), *extra, out=tmp_path / "best.txt").read_bytes()
    assert got == want and len(got.decode().splitlines()) == 5
    # and the scored list re-ranked without a model (every feature already in it)
    scored = nbest(LIST, *one_pass_args(four), out=tmp_path / "scored.nbest")
    again = nbest(scored, *extra, out=tmp_path / "best2.txt").read_bytes()
    assert again == want


def test_the_older_form_is_unchanged(tmp_path, tiny_model_path, tiny_second_seed_model_path):
    """Plain -m with --name; several plain -m: one feature, the ensemble (as NAME=A,B)."""
    plain = nbest(LIST, "-m", tiny_model_path, "-m", tiny_second_seed_model_path, "--name", "Ens",
                  out=tmp_path / "plain.nbest")  # fmt: skip
    spec = f"Ens={tiny_model_path},{tiny_second_seed_model_path}"
    named = nbest(LIST, "-m", spec, out=tmp_path / "named.nbest")
    assert plain.read_bytes() == named.read_bytes()
    default = nbest(LIST, "-m", tiny_model_path, out=tmp_path / "default.nbest")
    assert " RNNEncDec0= " in default.read_text()


def test_specs_are_parsed_and_checked(tmp_path, tiny_model_path):
    m = tiny_model_path
    assert nbest_feature_models([m]) == (FeatureModel("RNNEncDec0", (m,), False),)
    assert nbest_feature_models([m], name="X", inverse=True) == (FeatureModel("X", (m,), True),)
    assert nbest_feature_models([f"A={m}", f"B={m},{m}"], [f"C={m}"]) == (
        FeatureModel("A", (m,), False),
        FeatureModel("B", (m, m), False),
        FeatureModel("C", (m,), True),
    )
    # a model file whose name holds '=' is a plain file
    odd = tmp_path / "a=b.safetensors"
    odd.write_bytes(b"")
    assert nbest_feature_models([str(odd)])[0].paths == (str(odd),)
    for specs, inverse, message in [
        ([m, f"A={m}"], [], "not both"),
        ([m], [f"C={m}"], "not both"),
        ([], [m], "--inverse-model .*: give NAME=MODEL"),
        ([f"A={m}", f"A={m}"], [], "feature name A given twice"),
        ([f"A={m}"], [f"A={m}"], "--inverse-model A=.*: feature name A given twice"),
        ([f"A_1={m}"], [], "-m A_1=.*contains '_'"),
        ([f"A b={m}"], [], "is not valid"),
        ([f"A={m},"], [], "a model file name is empty"),
    ]:
        with pytest.raises(InputError, match=message):
            nbest_feature_models(specs, inverse)
    with pytest.raises(InputError, match="--name is for plain -m MODEL"):
        nbest_feature_models([f"A={m}"], name="X")
    with pytest.raises(InputError, match="--inverse is for plain -m MODEL"):
        nbest_feature_models([f"A={m}"], inverse=True)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["-m", "{m}", "-m", "A={m}"], "-m {m}: give every -m as NAME=MODEL"),
        (["-m", "A={m}", "--name", "B"], "--name is for plain -m MODEL"),
        (["-m", "A={m}", "-m", "A={m}"], "feature name A given twice"),
        (["-m", "LM0={m}"], "feature 'LM0' is already in this line"),
        (["-m", "A={m}", "--lm", "{m}", "--lm-name", "A"], "the model and the LM feature are both named A"),
        (["-m", "A={m}", "-m", "B=none.safetensors"], "none.safetensors"),
    ],
)  # fmt: skip
def test_bad_specs_are_one_line_and_no_output(tmp_path, tiny_model_path, flags, message):
    flags = [flag.format(m=tiny_model_path) for flag in flags]
    out = tmp_path / "out.nbest"
    result = CliRunner().invoke(
        cli, ["nbest", str(LIST), "--source", str(SOURCE), *flags, "-o", str(out), "--no-progress"]
    )
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message.format(m=tiny_model_path) in errors[0], result.stderr
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_model_of_the_other_direction_is_warned_of_per_model(
    tmp_path, tiny_model_path, tiny_inverse_model_path, caplog
):
    """An fr->en model given as a direct feature of an en->fr list: a warning naming it and
    its feature; the right model beside it, and the same model as --inverse-model: none."""
    from phrasescore.jobs.nbest.nbest import NBestOptions, rescore_nbest

    specs = [f"L2R={tiny_model_path}", f"Wrong={tiny_inverse_model_path}"]
    with caplog.at_level("WARNING"):
        rescore_nbest(str(LIST), str(SOURCE), specs, str(tmp_path / "o"), NBestOptions(),
                      progress=False)  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "feature Wrong" in warnings[0], warnings
    assert "--inverse-model Wrong=MODEL" in warnings[0]
    caplog.clear()
    options = NBestOptions(inverse_models=(f"Inv={tiny_inverse_model_path}",))
    with caplog.at_level("WARNING"):
        rescore_nbest(str(LIST), str(SOURCE), specs[:1], str(tmp_path / "o2"), options,
                      progress=False)  # fmt: skip
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_shards_of_one_pass_merge_into_its_bytes(tmp_path, four):
    """--shard K/N with several features: merge-shards joins the parts into the one-process
    list (the manifest records every feature's name and models)."""
    one = nbest(LIST, *one_pass_args(four), "--chunk-lines", "100", out=tmp_path / "one.nbest")
    parts = []
    for k in (1, 2):
        part = tmp_path / f"part{k}.nbest"
        nbest(LIST, *one_pass_args(four), "--chunk-lines", "100", "--shard", f"{k}/2", out=part)
        parts.append(str(part))
    result = invoke("merge-shards", *parts, "-o", tmp_path / "merged.nbest")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "merged.nbest").read_bytes() == one.read_bytes()
