"""TextNormalizer: tokenizer.perl/lowercase.perl-compatible tokens."""

from __future__ import annotations

import gzip

import pytest

from phrasescore.text.tokenize import TextNormalizer, split_moses_tokens


def read_gz(path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_tokenize_lowercase_matches_moses_pipeline_on_real_lines(data_dir, lang):
    raw = read_gz(data_dir / "text" / f"multi30k-sample.raw.{lang}.gz")
    reference = read_gz(data_dir / "text" / f"multi30k-sample.tok.lc.{lang}.gz")
    assert len(raw) == len(reference) == 171
    normalizer = TextNormalizer(lang, tokenize=True, lowercase=True)
    for raw_line, reference_line in zip(raw, reference, strict=True):
        assert normalizer(raw_line) == reference_line.split(), raw_line


def test_real_lines_with_escapes_and_the_final_period_rule(data_dir):
    en = TextNormalizer("en", tokenize=True, lowercase=True)
    fr = TextNormalizer("fr", tokenize=True, lowercase=True)
    # line 4527: raw text already holding an entity is escaped again, as tokenizer.perl does
    assert en("A man known as Deleon speaks at a Q&amp;A.")[-7:] == [
        "a", "q", "&amp;", "amp", ";", "a", ".",
    ]  # fmt: skip
    # tokenizer.perl splits the period of the last word even after a nonbreaking prefix
    assert en("People near 3rd St.")[-2:] == ["st", "."]
    assert fr("Deux femmes discutent dans une galerie d'art.")[-3:] == ["d&apos;", "art", "."]
    assert fr("une banderole avrovulcan.com.")[-2:] == ["avrovulcan.com", "."]
    # ... but not of a nonbreaking prefix inside the line
    assert en("Mr. Smith walks.") == ["mr.", "smith", "walks", "."]
    # a real line with double quotes and an English contraction
    quoted = en('A man in a "Stop the War" shirt isn\'t smiling.')
    assert quoted == ("a man in a &quot; stop the war &quot; shirt isn &apos;t smiling .".split())


def test_every_moses_special_character_is_escaped():
    normalizer = TextNormalizer("en", tokenize=True)
    tokens = normalizer('a [b] <c> d|e & "f" g\'s')
    assert tokens == [
        "a", "&#91;", "b", "&#93;", "&lt;", "c", "&gt;", "d", "&#124;", "e", "&amp;",
        "&quot;", "f", "&quot;", "g", "&apos;s",
    ]  # fmt: skip


def test_lowercase_after_tokenizing_and_case_kept_without_it():
    assert TextNormalizer("en", tokenize=True)("The Dog.") == ["The", "Dog", "."]
    assert TextNormalizer("en", tokenize=True, lowercase=True)("The Dog.") == ["the", "dog", "."]
    assert TextNormalizer("fr", lowercase=True)("L&apos; Homme ÉTÉ") == ["l&apos;", "homme", "été"]


def test_tokenised_text_is_only_split_never_tokenised_again():
    normalizer = TextNormalizer("en", tokenize=True, lowercase=True)
    assert normalizer.normalize_tokenized(" Q &amp; A\tst.  ") == ["q", "&amp;", "a", "st."]
    plain = TextNormalizer("en")
    assert plain("a &amp; b .") == ["a", "&amp;", "b", "."]
    assert plain("   ") == []


def test_split_moses_tokens_splits_on_spaces_and_tabs_only():
    assert split_moses_tokens("a  b\tc ") == ["a", "b", "c"]
    assert split_moses_tokens("a\u00a0b c") == ["a\u00a0b", "c"]  # as Moses reads a table


def test_state_round_trip():
    normalizer = TextNormalizer("fr", tokenize=True, lowercase=True)
    state = normalizer.to_state()
    assert state == {"lang": "fr", "tokenize": True, "lowercase": True}
    again = TextNormalizer.from_state(state)
    line = "L'homme (à droite) dit : « Bonjour ! »"
    assert again(line) == normalizer(line)
    assert repr(again) == repr(normalizer)
