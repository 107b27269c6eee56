"""n-best lists (phrasescore.moses.nbest): reading, adding a feature, weights and totals."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest

from phrasescore.errors import InputError
from phrasescore.moses.nbest import (
    add_feature,
    check_feature_name,
    format_feature_value,
    iter_nbest_groups,
    parse_features,
    read_nbest,
    read_weights,
    total_score,
)

MOSES = Path(__file__).parent / "data" / "moses"
LISTS = [
    "labelled-5best.nbest",
    "labelled-50best.nbest",
    "oldlabels.nbest.gz",
    "mert-example.nbest",
    "multi30k.head200.nbest.gz",
]


def text_of(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name", LISTS)
def test_lines_read_back_byte_identical(name):
    entries = list(read_nbest(str(MOSES / name)))
    assert "".join(entry.line() for entry in entries) == text_of(MOSES / name)


@pytest.mark.parametrize("name", ["labelled-5best.nbest", "labelled-50best.nbest"])
@pytest.mark.parametrize("compress", [False, True])
def test_added_feature_changes_nothing_else(tmp_path, name, compress):
    source = MOSES / name
    if compress:
        source = tmp_path / (name + ".gz")
        source.write_bytes(gzip.compress((MOSES / name).read_bytes()))
    original = text_of(MOSES / name).splitlines(keepends=True)
    added = [add_feature(e, "RNNEncDec0", -3.25) for e in read_nbest(str(source))]
    assert len(added) == len(original)
    for old, new in zip(original, added, strict=True):
        fields_old, fields_new = old.split("|||"), new.split("|||")
        assert fields_new[2] == fields_old[2].rstrip() + " RNNEncDec0= -3.25 "
        assert fields_new[:2] == fields_old[:2] and fields_new[3:] == fields_old[3:]
        assert new.replace(" RNNEncDec0= -3.25", "", 1) == old


def test_added_feature_exact_lines_modern_labels():
    first = next(read_nbest(str(MOSES / "labelled-5best.nbest")))
    assert add_feature(first, "RNNEncDec0", -12.3456) == (
        "0 ||| beide Versäumnisse , terroristische Gruppen in Pakistan gestärkt . ||| IRSTLM0= "
        "-112.888 Distortion0= 0 WordPenalty0= -9 PhraseDictionaryMemory0= -5.01064 -2.17433 "
        "-1.73026 -6.17638 2.99969 RNNEncDec0= -12.3456 ||| -549.862 ||| 0=0 1=1 2=2 3=3 4=4 "
        "5-6=5-6 7=7 8=8 ||| 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8\n"
    )


def test_added_feature_exact_lines_old_labels():
    entries = list(read_nbest(str(MOSES / "oldlabels.nbest.gz")))
    assert add_feature(entries[0], "RNNEncDec0", -0.5) == (
        "0||| mr president , we shall be in biarritz , look a little further .  ||| d= 0 "
        "-3.30693 0 0 -2.83036 0 0 lm= -47.2982 tm= -36.7163 -58.3679 -12.6473 -17.133 7.99917 "
        "w= -14 RNNEncDec0= -0.5 ||| -9.26049\n"
    )
    assert entries[0].id == 0 and entries[0].rest is None
    original = text_of(MOSES / "oldlabels.nbest.gz").splitlines(keepends=True)
    added = [add_feature(e, "RNNEncDec0", -0.5) for e in entries]
    assert [line.replace(" RNNEncDec0= -0.5", "", 1) for line in added] == original


def test_added_feature_colon_labels():
    first = next(read_nbest(str(MOSES / "mert-example.nbest")))
    line = add_feature(first, "RNN0", -7)
    assert line.split("|||")[2].endswith(" w: -9 RNN0= -7 ")
    with pytest.raises(InputError, match="'tm' is already in this line"):
        add_feature(first, "tm", -1)


def test_underscore_name_is_refused():
    first = next(read_nbest(str(MOSES / "labelled-5best.nbest")))
    with pytest.raises(InputError, match="contains '_': MERT takes such a name for a sparse"):
        add_feature(first, "RNN_score", -1.0)


@pytest.mark.parametrize("name", ["", "0abc", "a b", "a=b", "a|b", "a:b"])
def test_malformed_names_are_refused(name):
    with pytest.raises(InputError):
        check_feature_name(name)


def test_duplicate_name_is_refused_with_file_and_line(tmp_path):
    path = str(MOSES / "labelled-50best.nbest")
    entries = list(read_nbest(path))
    with pytest.raises(InputError) as info:
        add_feature(entries[3], "WordPenalty0", -1.0)
    assert str(info.value) == f"{path}:4: feature 'WordPenalty0' is already in this line"
    twice = add_feature(entries[0], "RNN0", -1.0)
    (again,) = read_nbest(write(tmp_path / "n", twice.encode()))
    with pytest.raises(InputError, match="already in this line"):
        add_feature(again, "RNN0", -2.0)


def test_feature_values_formatted_as_moses_prints_them():
    assert format_feature_value(-12.345678) == "-12.3457"
    assert format_feature_value(-2.3502) == "-2.3502"
    assert format_feature_value(4) == "4"
    assert format_feature_value(-0.0) == "0"
    assert format_feature_value(-1234567.0) == "-1.23457e+06"
    assert format_feature_value(-3.5e-7) == "-3.5e-07"
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            format_feature_value(bad)


def test_parse_features():
    assert parse_features(" A0= 1 -2 B0= 3 sparse_x= 1 ") == [
        ("A0", [1.0, -2.0]),
        ("B0", [3.0]),
        ("sparse_x", [1.0]),
    ]
    assert parse_features(" d: 0 -7.5 lm: -41 ") == [("d", [0.0, -7.5]), ("lm", [-41.0])]
    assert parse_features(" 1 2 ") == [("", [1.0, 2.0])]
    with pytest.raises(InputError, match="not a number: 'x'"):
        parse_features("A= x")


def test_groups_are_contiguous_ids():
    entries = list(read_nbest(str(MOSES / "multi30k.head200.nbest.gz")))
    groups = list(iter_nbest_groups(entries))
    assert [e for g in groups for e in g] == entries
    assert all(len({e.id for e in g}) == 1 for g in groups)
    assert [g[0].id for g in groups] == sorted({e.id for e in entries})
    assert len(list(iter_nbest_groups(read_nbest(str(MOSES / "oldlabels.nbest.gz"))))) == 10


def test_non_contiguous_ids_are_refused(tmp_path):
    path = write(
        tmp_path / "n", b"0 ||| a ||| F= 1 ||| 1\n1 ||| b ||| F= 1 ||| 1\n0 ||| c ||| F= 1 ||| 1\n"
    )
    with pytest.raises(InputError) as info:
        list(iter_nbest_groups(read_nbest(path)))
    assert str(info.value).startswith(f"{path}:3: the hypotheses of sentence 0 are not contiguous")


@pytest.mark.parametrize(
    "data, message",
    [
        (b"0 ||| a ||| F= 1\n", "expected at least 4 fields separated by '|||'"),
        (b"x ||| a ||| F= 1 ||| 1\n", "the sentence id must be a non-negative integer, found 'x'"),
        (b"-1 ||| a ||| F= 1 ||| 1\n", "the sentence id must be a non-negative integer"),
        (b"0 ||| a ||| F= 1 ||| total\n", "the total score is not a number: 'total'"),
        (b"0 ||| a ||| LM0= x42.0539 ||| 1\n", "feature value is not a number: 'x42.0539'"),
        (b"0 ||| \xe9 ||| F= 1 ||| 1\n", "invalid UTF-8 at byte 6"),
        # what Python's float reads and Moses' strtod does not: 10, 5, 0.5, 0
        (b"0 ||| a ||| F= 1_0 ||| 1\n", "feature value is not a number: '1_0' (write it without"),
        (
            "0 ||| a ||| F= \u0665 ||| 1\n".encode(),
            "feature value is not a number: '\u0665' (Moses",
        ),
        ("0 ||| a ||| F= \uff10.\uff15 ||| 1\n".encode(), "feature value is not a number: '"),
        (b"0 ||| a ||| F= 1e-400 ||| 1\n", "feature value is 1e-400: too small for a number"),
        (b"0 ||| a ||| F= 1 ||| 1_0\n", "the total score is not a number: '1_0'"),
    ],
)
def test_malformed_lines_are_refused(tmp_path, data, message):
    path = write(tmp_path / "bad.nbest", b"0 ||| ok ||| F= 1 ||| 1\n" + data)
    with pytest.raises(InputError) as info:
        list(read_nbest(path))
    assert str(info.value).startswith(f"{path}:2: {message}")


def test_line_endings(tmp_path):
    path = write(tmp_path / "n", b"0 ||| a ||| F= 1 ||| 1\r\n0 ||| b ||| F= 2 ||| 2")
    first, last = read_nbest(path)
    assert add_feature(first, "G", 0.5) == "0 ||| a ||| F= 1 G= 0.5 ||| 1\r\n"
    assert add_feature(last, "G", 0.5) == "0 ||| b ||| F= 2 G= 0.5 ||| 2\n"
    assert (first.hypothesis, first.features, first.total) == ("a", " F= 1 ", " 1")


# ----------------------------------------------------------------------------- weights
def test_read_weights_modern():
    weights = read_weights(str(MOSES / "multi30k.moses.ini"))
    assert weights == {
        "UnknownWordPenalty0": [1.0],
        "WordPenalty0": [-1.0],
        "PhrasePenalty0": [0.2],
        "TranslationModel0": [0.2, 0.2, 0.2, 0.2],
        "LexicalReordering0": [0.3] * 6,
        "Distortion0": [0.3],
        "LM0": [0.5],
    }


def test_read_weights_old_sections_use_old_labels():
    weights = read_weights(str(MOSES / "mert.moses.ini"))
    assert weights == {
        "d": [0.4, 0.15, 0.15, 0.15, 0.15, 0.15, 0.15],
        "lm": [0.5],
        "tm": [0.2] * 5,
        "w": [-1.0],
    }


def test_read_weights_plain_file_and_errors(tmp_path):
    path = write(tmp_path / "w", b"A0= 0.5 -1  # comment\n\nB0= 2\n")
    assert read_weights(path) == {"A0": [0.5, -1.0], "B0": [2.0]}
    bad = write(tmp_path / "bad", b"[weight]\nA0 0.5\n")
    with pytest.raises(InputError, match=r"bad:2: cannot read weights in \[weight\]"):
        read_weights(bad)


def test_total_score_matches_moses_totals():
    weights = read_weights(str(MOSES / "multi30k.moses.ini"))
    for entry in read_nbest(str(MOSES / "multi30k.head200.nbest.gz")):
        assert total_score(entry.parsed_features(), weights) == pytest.approx(
            float(entry.total), abs=2e-4
        )


def test_total_score_with_a_new_feature(tmp_path):
    weights = read_weights(str(MOSES / "multi30k.moses.ini"))
    first = next(read_nbest(str(MOSES / "multi30k.head200.nbest.gz")))
    line = add_feature(first, "RNNEncDec0", -4.0)
    (rescored,) = read_nbest(write(tmp_path / "n", line.encode()))
    features = rescored.parsed_features()
    with pytest.raises(InputError, match="no weight for feature 'RNNEncDec0'"):
        total_score(features, weights)
    weights["RNNEncDec0"] = [0.5]
    assert total_score(features, weights) == pytest.approx(float(first.total) - 2.0, abs=2e-4)
    weights["RNNEncDec0"] = [0.5, 1.0]
    with pytest.raises(InputError, match="1 values but 2 weights"):
        total_score(features, weights)
    assert total_score([("sparse_x", [3.0])], {}) == 0.0


@pytest.mark.parametrize(
    "weight, message",
    [
        ("1_0", "weight is not a number: '1_0' (write it without '_')"),
        ("\u0661", "weight is not a number: '\u0661' (Moses reads ASCII digits only)"),
        ("\uff15", "weight is not a number: '\uff15' (Moses reads ASCII digits only)"),
        ("1e-400", "weight is 1e-400: too small for a number, it would be read as 0"),
    ],
)
def test_a_weights_file_refuses_what_moses_does_not_read_as_written(tmp_path, weight, message):
    """A --weights file once read ``1_0`` as 10 and other scripts' digits as numbers, and
    ``1e-400`` as 0: not the weights Moses would use, nor what the option parser takes."""
    path = tmp_path / "w.txt"
    path.write_text(f"LM0= 0.5\nTM0= 0.2 {weight}\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_weights(str(path))
    assert str(info.value).startswith(f"{path}:2: {message}")


def test_a_negative_zero_in_a_file_is_read_as_zero(tmp_path):
    """strtod reads ``-0`` as a negative zero, 0 in every sum Moses makes; it is read as 0, so
    that it is never written back as ``-0``."""
    path = tmp_path / "w.txt"
    path.write_text("LM0= -0 0.5\n", encoding="utf-8")
    [(name, [zero, half])] = read_weights(str(path)).items()
    assert (name, zero, half, math.copysign(1.0, zero)) == ("LM0", 0.0, 0.5, 1.0)
    [(_, [value])] = parse_features(" F= -0.0e5 ")
    assert value == 0.0 and math.copysign(1.0, value) == 1.0
