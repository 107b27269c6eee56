"""moses/columnar.py: a chunk's arrays and spliced output against the line-by-line parser and
format_entry (the same bytes, the same errors), on hand-made lines, random ones and the shipped
tables."""

from __future__ import annotations

import gzip
import random

import numpy as np
import pytest

from phrasescore.errors import InputError
from phrasescore.moses.columnar import parse_chunk, splice
from phrasescore.moses.phrase_table import format_entry, parse_phrase_table_chunk

from .conftest import DATA


def old_way(data: bytes, num_scores: int, columns):
    text = data.decode("utf-8")
    entries = parse_phrase_table_chunk(text, "t", 5, num_scores)
    out = "".join(format_entry(e, [c[i] for c in columns]) for i, e in enumerate(entries)).encode(
        "utf-8"
    )
    return entries, out


def new_way(data: bytes, num_scores: int, columns):
    chunk = parse_chunk(data, "t", 5, num_scores)
    return chunk, splice(chunk, columns)


def columns_for(n: int, k: int, seed: int = 0):
    rng = random.Random(seed)
    return [[repr(rng.random()) for _ in range(n)] for _ in range(k)]


def check_same(data: bytes, num_scores: int, k: int = 1):
    try:
        entries, expected = old_way(data, num_scores, columns_for(data.count(b"\n") + 1, k))
    except InputError as exc:
        with pytest.raises(InputError) as got:
            parse_chunk(data, "t", 5, num_scores)
        assert str(got.value) == str(exc)
        return None
    columns = [c[: len(entries)] for c in columns_for(data.count(b"\n") + 1, k)]
    _, expected = old_way(data, num_scores, columns)
    chunk, out = new_way(data, num_scores, columns)
    assert out == expected
    assert chunk.sources() == [e.source.encode() for e in entries]
    assert chunk.targets() == [e.target.encode() for e in entries]
    return chunk


LINES = [
    b"a b ||| c d ||| 0.5 0.25 ||| 0-0 ||| 1 1 1 ||| |||\n",
    b"a b ||| c d ||| 0.5 0.25\n",
    b"a b ||| c d ||| 0.5 0.25\r\n",
    b"a b ||| e ||| 1 1e-05 ||| |||\n",
    b"  a b ||| c ||| 0.5 0.25\n",
    b"a\tb ||| c ||| 0.5 0.25\n",
    b"a b\t||| c ||| 0.5 0.25\n",
    b"a b ||| c |||  0.5  0.25  ||| x\n",
    b"a b |||c|||0.5 0.25\n",
    b"a |||| b ||| c ||| 0.5 0.25\n",
    b"a ||| b ||| 0.5\t0.25\n",
    b"a ||| b ||| +0.5 0.25\n",
    b"a ||| b ||| .5 5. \n",
    b"a ||| b ||| 5.E+05 1e-99\n",
    b"a ||| b ||| 1e-400 0.5\n",
    b"a ||| b ||| 1e999 0.5\n",
    b"a ||| b ||| nan 0.5\n",
    b"a ||| b ||| 0 0.5\n",
    b"a ||| b ||| -1 0.5\n",
    b"a ||| b ||| 1_0 0.5\n",
    b"a ||| b ||| 0.5\n",
    b"a ||| b ||| 0.5 0.5 0.5\n",
    b"a ||| b\n",
    b"a\n",
    b" ||| b ||| 0.5 0.5\n",
    b"a |||  ||| 0.5 0.5\n",
    b"a ||| b ||| \n",
    b"a\rb ||| c ||| 0.5 0.5\n",
    b"a ||| b ||| 0.5 0.5\r\r\n",
    b"\xc3\xa9t\xc3\xa9 ||| \xc3\xa9 ||| 0.5 0.5 ||| \xe2\x80\x83 |||\n",
    b"a ||| b ||| 0.5\xc2\xa00.5\n",
    b"a ||| b ||| 0.5 0.5 |||\n",
    b"a ||| b ||| 0.5 0.5 ||||||\n",
    b"a ||| b ||| 00 0.5\n",
    b"a ||| b ||| 0.0e5 0.5\n",
    b"a ||| b ||| e5 0.5\n",
    b"a ||| b ||| 5e 0.5\n",
    b"a ||| b ||| 5e+ 0.5\n",
    b"a ||| b ||| 5e5.1 0.5\n",
    b"a ||| b ||| 5e-+1 0.5\n",
    b"a ||| b ||| 1e-320 0.5\n",
    b"a ||| b ||| . 0.5\n",
]


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("k", [0, 1, 3])
def test_lines_alone_and_among_good_ones(line, k):
    good = b"x y ||| z ||| 0.1 0.2 ||| 0-0 |||\n"
    check_same(line, 2, k)
    check_same(good + line + good, 2, k)
    check_same(good + line.rstrip(b"\n"), 2, k)
    check_same(line.rstrip(b"\r\n"), 2, k)


def test_invalid_utf8_names_the_line():
    data = b"a ||| b ||| 0.5\nc\xff ||| d ||| 0.5\n"
    with pytest.raises(InputError, match=r"^t:6: invalid UTF-8"):
        parse_chunk(data, "t", 5, 1)


def test_random_lines():
    rng = random.Random(46)
    pieces = ["a", "b", " ", "  ", "\t", "|||", "|", "0.5", "1e-5", "1", " ||| ", "é", "\r", "x y"]
    for _ in range(3000):
        lines = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.6:
                lines.append(
                    f"s{rng.randint(0, 3)} ||| t ||| 0.5 {rng.choice(['1', '2e-3', '.5'])}"
                )
            else:
                lines.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))))
        data = ("\n".join(lines) + rng.choice(["\n", "", "\r\n"])).encode()
        check_same(data, 2, rng.randint(0, 2))


def test_score_grammar_against_float():
    """Every score the vectorised grammar takes is a finite float > 0, and every other one is
    judged by the line-by-line check (the same errors)."""
    rng = random.Random(7)
    alphabet = "0123456789.eE+-"
    taken = 0
    for _ in range(5000):
        token = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7)))
        data = f"a ||| b ||| {token}\n".encode()
        chunk = check_same(data, 1)
        if chunk is not None and not chunk.entries:
            taken += 1
            assert _accepted(token), token
    assert taken > 100


def _accepted(token: str) -> bool:
    try:
        value = float(token)
    except ValueError:
        return False
    return 0.0 < value < float("inf") and "_" not in token


@pytest.mark.parametrize(
    "name",
    ["moses/multi30k.head300.phrase-table.gz", "moses/de-en.5scores.slice300.phrase-table.gz",
     "moses/sparse.phrase-table.gz", "moses-system/phrase-table.gz"],
)  # fmt: skip
def test_shipped_tables(name):
    data = gzip.open(DATA / name).read()
    first = data[: data.index(b"\n") + 1]
    num_scores = len(parse_phrase_table_chunk(first.decode(), "t")[0].scores)
    chunk = check_same(data, num_scores, 2)
    assert chunk is not None
    assert len(chunk.entries) == 0
    runs = chunk.source_runs()
    sources = chunk.sources()
    expected = [i for i in range(len(sources)) if i == 0 or sources[i] != sources[i - 1]]
    assert runs.tolist() == expected
    src_bytes, tgt_bytes = chunk.phrase_bytes()
    assert src_bytes.tolist() == [len(s) for s in sources]
    assert np.all(tgt_bytes > 0)


@pytest.mark.parametrize(
    "scores",
    [b"0.5 1e", b"0.5 1e-", b"0.5 -1", b"1e+5 -1", b"1e5 +1", b"5e5e5 1", b"1e5. 1", b"1..5 1",
     b"e5 1", b"0e5 1", b"0.0 1", b"1 0", b"1e-5 1E+05", b"1e005 1", b".5 5.", b"+.5 1"],
)  # fmt: skip
def test_scores_next_to_other_lines_scores(scores):
    """A score is judged alone, whatever ends the line before it."""
    for before in (b"a ||| b ||| 1 1e\n", b"a ||| b ||| 1 1\n", b""):
        check_same(before + b"a ||| b ||| " + scores + b"\n" + before, 2)
