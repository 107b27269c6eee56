"""moses.ini updates (phrasescore.moses.ini), checked against expected files written by hand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from phrasescore.errors import InputError
from phrasescore.moses.ini import (
    count_features_and_weights,
    list_phrase_tables,
    update_moses_ini,
    update_moses_ini_text,
)

MOSES = Path(__file__).parent / "data" / "moses"
EXPECTED = MOSES / "expected"


def assert_moses_would_start(text: str) -> None:
    """Moses' rule: as many weights as features, for every feature that has a weight line."""
    counts = count_features_and_weights(text)
    for name, (features, weights) in counts.items():
        if features is not None and weights is not None:
            assert features == weights, f"{name}: {features} features, {weights} weights"
    for table in list_phrase_tables(text):
        assert counts[table.name] == (table.num_features, table.num_features)


# (ini, table selector, new table path, new weights, comment)
CASES = {
    "basic": (
        "${MODEL_PATH}/basic-surface-only/phrase-table.gz",
        "${MODEL_PATH}/basic-surface-only/phrase-table.rnn.gz",
        [0.2],
        "phrasescore: added column from model abc123",
    ),
    "oldformat": (
        None,
        "${MODEL_PATH}/basic-surface-only/phrase-table.rnn.gz",
        [0.2, 0.1],
        None,
    ),
    "factored": ("TranslationModel0", "${TEST_PATH}/phrase-table.0-0.1.1.rnn.gz", [0.2], None),
    "nbest": (
        "PhraseDictionaryMemory0",
        "${MODEL_PATH}/ptable-with-alignment/phrase-table.rnn.gz",
        [0.5],
        None,
    ),
    "mert": ("${TM_PATH}/phrase-table.0-0.gz", "${TM_PATH}/phrase-table.0-0.rnn.gz", None, None),
    "multi30k": ("phrase-table.gz", "phrase-table.rnn.gz", None, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_update_matches_the_expected_file(tmp_path, name):
    table, new_path, weights, comment = CASES[name]
    out = tmp_path / "moses.ini"
    update = update_moses_ini(
        str(MOSES / f"{name}.moses.ini"),
        table,
        new_table_path=new_path,
        n_new=len(weights) if weights else 1,
        weights=weights,
        out_path=str(out),
        comment=comment,
    )
    expected = (EXPECTED / f"{name}.moses.ini").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == expected
    assert update.text == expected
    assert update.new_path == new_path
    assert update.new_num_features == update.old_num_features + (len(weights) if weights else 1)
    assert update.binarise_command is None and update.notes == []
    assert_moses_would_start(expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_original_inis_satisfy_the_rule(name):
    assert_moses_would_start((MOSES / f"{name}.moses.ini").read_text())


def test_default_feature_names_count_unnamed_features_per_class():
    text = (
        "[feature]\n"
        "PhraseDictionaryMemory path=a.gz num-features=4\n"
        "PhraseDictionaryMemory name=TM path=b.gz num-features=4\n"
        "PhraseDictionaryCompact path=c num-features=4\n"
        "PhraseDictionaryMemory path=d.gz num-features=4\n"
    )
    names = [t.name for t in list_phrase_tables(text)]
    assert names == [
        "PhraseDictionaryMemory0",
        "TM",
        "PhraseDictionaryCompact0",
        "PhraseDictionaryMemory1",
    ]


def test_counts_as_moses_sees_them():
    counts = count_features_and_weights((MOSES / "basic.moses.ini").read_text())
    assert counts == {
        "KENLM0": (1, 1),
        "Distortion0": (1, 1),
        "WordPenalty0": (1, 1),
        "UnknownWordPenalty0": (1, None),
        "PhraseDictionaryMemory0": (5, 5),
    }
    assert count_features_and_weights((MOSES / "oldformat.moses.ini").read_text()) == {
        "PhraseDictionaryMemory0": (5, 5)
    }


# ----------------------------------------------------------------------------- ${VAR} paths
def test_var_path_matched_by_expanded_path_and_style_kept(tmp_path, monkeypatch):
    (tmp_path / "basic-surface-only").mkdir()
    monkeypatch.setenv("MODEL_PATH", str(tmp_path))
    text = (MOSES / "basic.moses.ini").read_text()
    new = str(tmp_path / "basic-surface-only" / "phrase-table.rnn.gz")
    update = update_moses_ini_text(text, str(tmp_path / "basic-surface-only/phrase-table.gz"), new)
    assert update.new_path == "${MODEL_PATH}/basic-surface-only/phrase-table.rnn.gz"
    assert "path=${MODEL_PATH}/basic-surface-only/phrase-table.rnn.gz num-features=6" in update.text

    elsewhere = str(tmp_path / "phrase-table.rnn.gz")
    update = update_moses_ini_text(text, "PhraseDictionaryMemory0", elsewhere)
    assert update.new_path == elsewhere


def test_var_path_matched_by_realpath(tmp_path, monkeypatch):
    real = tmp_path / "real"
    (real / "basic-surface-only").mkdir(parents=True)
    os.symlink(real, tmp_path / "link")
    monkeypatch.setenv("MODEL_PATH", str(tmp_path / "link"))
    monkeypatch.chdir(tmp_path)
    text = (MOSES / "basic.moses.ini").read_text()
    update = update_moses_ini_text(
        text, "real/basic-surface-only/phrase-table.gz", "real/basic-surface-only/new.gz"
    )
    assert update.feature == "PhraseDictionaryMemory0"
    assert update.new_path == "${MODEL_PATH}/basic-surface-only/new.gz"


def test_relative_path_resolved_from_the_ini_directory(tmp_path, monkeypatch):
    ini = tmp_path / "model" / "moses.ini"
    ini.parent.mkdir()
    ini.write_text((MOSES / "multi30k.moses.ini").read_text())
    monkeypatch.chdir(tmp_path)
    update = update_moses_ini(
        str(ini), "model/phrase-table.gz", new_table_path="model/phrase-table.rnn.gz"
    )
    assert update.new_path == "phrase-table.rnn.gz"
    assert "path=phrase-table.rnn.gz input-factor=0" in ini.read_text()
    assert sorted(p.name for p in ini.parent.iterdir()) == ["moses.ini"]


# ----------------------------------------------------------------------------- several tables
SEVERAL = """[feature]
PhraseDictionaryMemory input-factor=0 output-factor=0 path=/m/pt-a.gz num-features=4
PhraseDictionaryMemory input-factor=0 output-factor=0 path=/m/pt-b.gz num-features=4
PhraseDictionaryMemory name=Extra num-features=5 path=/m/pt-c.gz input-factor=0 output-factor=0
[weight]
PhraseDictionaryMemory0= 0.1 0.1 0.1 0.1
PhraseDictionaryMemory1= 0.2 0.2 0.2 0.2  # tuned
Extra= 0.3 0.3 0.3 0.3 0.3
"""


def test_several_tables_select_by_name_or_path():
    update = update_moses_ini_text(SEVERAL, "PhraseDictionaryMemory1", "/m/pt-b.rnn.gz")
    assert update.text == SEVERAL.replace(
        "path=/m/pt-b.gz num-features=4", "path=/m/pt-b.rnn.gz num-features=5"
    ).replace(
        "PhraseDictionaryMemory1= 0.2 0.2 0.2 0.2  # tuned",
        "PhraseDictionaryMemory1= 0.2 0.2 0.2 0.2 0.2  # tuned",
    )
    by_path = update_moses_ini_text(SEVERAL, "/m/pt-b.gz", "/m/pt-b.rnn.gz")
    assert by_path.text == update.text
    extra = update_moses_ini_text(SEVERAL, "/m/pt-c.gz", "/m/pt-c.rnn.gz", weights=[1])
    assert "Extra= 0.3 0.3 0.3 0.3 0.3 1\n" in extra.text
    assert "num-features=6 path=/m/pt-c.rnn.gz" in extra.text
    assert_moses_would_start(extra.text)


def test_several_tables_need_a_choice():
    with pytest.raises(InputError) as info:
        update_moses_ini_text(SEVERAL, None, "/m/new.gz")
    assert "several phrase tables" in str(info.value)
    assert "PhraseDictionaryMemory1 (path=/m/pt-b.gz)" in str(info.value)


def test_table_not_in_the_ini_lists_the_tables_found():
    with pytest.raises(InputError) as info:
        update_moses_ini_text(SEVERAL, "/m/other.gz", "/m/new.gz")
    assert str(info.value) == (
        "phrase table '/m/other.gz' is not in the ini; phrase tables found: "
        "PhraseDictionaryMemory0 (path=/m/pt-a.gz); PhraseDictionaryMemory1 (path=/m/pt-b.gz); "
        "Extra (path=/m/pt-c.gz)"
    )
    with pytest.raises(InputError, match="declares no phrase table"):
        update_moses_ini_text("[feature]\nWordPenalty\n[weight]\nWordPenalty0= -1\n", None, "x")


OLD_SEVERAL = """[ttable-file]
0 0 0 5 /m/pt-a.gz
0 0 0 4 /m/pt-b.gz

[weight-t]
0.1
0.1
0.1
0.1
0.1
0.2
0.2
0.2
0.2

[weight-w]
-1
"""


def test_old_format_several_tables_weights_inserted_in_place():
    first = update_moses_ini_text(OLD_SEVERAL, "/m/pt-a.gz", "/m/pt-a.rnn.gz", weights=[0.7])
    assert first.text == OLD_SEVERAL.replace(
        "0 0 0 5 /m/pt-a.gz", "0 0 0 6 /m/pt-a.rnn.gz"
    ).replace("0.1\n0.2", "0.1\n0.7\n0.2")
    second = update_moses_ini_text(OLD_SEVERAL, "PhraseDictionaryMemory1", "/m/b.gz", weights=[0.7])
    assert second.text == OLD_SEVERAL.replace("0 0 0 4 /m/pt-b.gz", "0 0 0 5 /m/b.gz").replace(
        "0.2\n\n[weight-w]", "0.2\n0.7\n\n[weight-w]"
    )
    assert count_features_and_weights(second.text) == {
        "PhraseDictionaryMemory0": (5, 5),
        "PhraseDictionaryMemory1": (5, 5),
    }


def test_old_format_weights_before_tables_with_a_comment():
    text = "[weight-t]\n0.1\n0.2\n[ttable-file]\n0 0 0 1 a.gz\n0 0 0 1 b.gz\n"
    update = update_moses_ini_text(text, "a.gz", "new.gz", weights=[0.5], comment="added")
    assert update.text == (
        "[weight-t]\n0.1\n0.5\n0.2\n[ttable-file]\n# added\n0 0 0 2 new.gz\n0 0 0 1 b.gz\n"
    )


def test_old_format_too_few_weights():
    text = OLD_SEVERAL.replace("0.2\n0.2\n0.2\n0.2\n", "0.2\n")
    with pytest.raises(InputError, match=r"\[weight-t\] has 6 weights, too few"):
        update_moses_ini_text(text, "/m/pt-b.gz", "/m/new.gz")


# ----------------------------------------------------------------------------- binarised tables
def test_compact_table_gets_the_binarise_command():
    text = (
        "[feature]\n"
        "PhraseDictionaryCompact name=TranslationModel0 num-features=4 "
        "path=/m/phrase-table.minphr input-factor=0 output-factor=0\n"
        "[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n"
    )
    update = update_moses_ini_text(text, "/m/phrase-table", "/m/phrase-table.rnn.gz")
    assert update.binarise_command == [
        "processPhraseTableMin",
        "-in",
        "/m/phrase-table.rnn.gz",
        "-out",
        "/m/phrase-table.rnn",
        "-nscores",
        "5",
    ]
    assert update.binarise_command_line == (
        "processPhraseTableMin -in /m/phrase-table.rnn.gz -out /m/phrase-table.rnn -nscores 5"
    )
    assert "path=/m/phrase-table.rnn.minphr" in update.text
    assert "run 'processPhraseTableMin" in update.notes[0]

    no_suffix = update_moses_ini_text(
        text.replace(".minphr", ""), "/m/phrase-table.minphr", "/m/pt.rnn.gz", n_new=2
    )
    assert "path=/m/pt.rnn input-factor" in no_suffix.text
    assert no_suffix.binarise_command[-1] == "6"


def test_old_format_compact_and_on_disk_tables():
    text = "[ttable-file]\n12 0 0 4 /m/pt.minphr\n2 0,1 0 4 /m/pt.bin\n[weight-t]\n" + "0.2\n" * 8
    compact = update_moses_ini_text(text, "PhraseDictionaryCompact0", "/m/new.gz")
    assert "12 0 0 5 /m/new.minphr\n" in compact.text
    assert compact.binarise_command[0] == "processPhraseTableMin"
    on_disk = update_moses_ini_text(text, "/m/pt.bin", "/m/ondisk.gz")
    assert on_disk.binarise_command == [
        "CreateOnDiskPt",
        "2",
        "1",
        "5",
        "100",
        "2",
        "/m/ondisk.gz",
        "/m/ondisk",
    ]
    assert "2 0,1 0 5 /m/ondisk\n" in on_disk.text


# ----------------------------------------------------------------------------- details
def test_crlf_ini_keeps_its_line_endings(tmp_path):
    ini = tmp_path / "moses.ini"
    original = (MOSES / "factored.moses.ini").read_text().replace("\n", "\r\n")
    ini.write_bytes(original.encode())
    update_moses_ini(
        str(ini), new_table_path="${TEST_PATH}/phrase-table.0-0.1.1.rnn.gz", comment="# added"
    )
    data = ini.read_bytes().decode()
    expected = (EXPECTED / "factored.moses.ini").read_text().replace("\n", "\r\n")
    expected = expected.replace(
        "PhraseDictionaryMemory name=", "# added\r\nPhraseDictionaryMemory name="
    )
    assert data == expected


def test_missing_num_features_means_one():
    text = "[feature]\nPhraseDictionaryMemory path=pt.gz\n[weight]\nPhraseDictionaryMemory0= 1\n"
    update = update_moses_ini_text(text, None, "new.gz", n_new=2, weights=[0.5, 0.25])
    assert update.text == (
        "[feature]\nPhraseDictionaryMemory path=new.gz num-features=3\n"
        "[weight]\nPhraseDictionaryMemory0= 1 0.5 0.25\n"
    )


def test_last_line_without_newline():
    text = "[ttable-file]\n0 0 0 1 pt.gz\n[weight-t]\n0.3"
    update = update_moses_ini_text(text, None, "new.gz", weights=[0.5])
    assert update.text == "[ttable-file]\n0 0 0 2 new.gz\n[weight-t]\n0.3\n0.5\n"
    modern = "[feature]\nPhraseDictionaryMemory path=pt.gz num-features=1\n[weight]\nPhraseDictionaryMemory0= 1"
    assert update_moses_ini_text(modern, None, "n.gz").text.endswith(
        "PhraseDictionaryMemory0= 1 0.2"
    )


def test_inconsistent_ini_is_refused():
    text = "[feature]\nPhraseDictionaryMemory path=pt.gz num-features=4\n[weight]\nPhraseDictionaryMemory0= 1 1 1\n"
    with pytest.raises(InputError, match="declares 4 features but has 3 weights"):
        update_moses_ini_text(text, None, "new.gz")
    with pytest.raises(InputError, match="no \\[weight\\] line for PhraseDictionaryMemory0"):
        update_moses_ini_text(text.replace("PhraseDictionaryMemory0= 1 1 1\n", ""), None, "n.gz")


def test_multimodel_components_are_refused():
    text = (
        "[feature]\n"
        "PhraseDictionaryMemory name=PT0 tuneable=false num-features=4 path=a.gz\n"
        "PhraseDictionaryMemory name=PT1 tuneable=false num-features=4 path=b.gz\n"
        "PhraseDictionaryMultiModel name=MM num-features=4 components=PT0,PT1 lambda=0.5,0.5\n"
        "[weight]\nPT0= 0 0 0 0\nPT1= 0 0 0 0\nMM= 0.2 0.2 0.2 0.2\n"
    )
    with pytest.raises(InputError, match="belongs to PhraseDictionaryMultiModel MM"):
        update_moses_ini_text(text, "a.gz", "new.gz")


def test_argument_checks():
    text = (MOSES / "basic.moses.ini").read_text()
    with pytest.raises(ValueError):
        update_moses_ini_text(text, None, "new.gz", n_new=2, weights=[0.2])
    with pytest.raises(ValueError):
        update_moses_ini_text(text, None, "new.gz", n_new=0)
    with pytest.raises(ValueError):
        update_moses_ini_text(text, None, "new.gz", comment="two\nlines")


def test_failed_update_leaves_the_ini_alone(tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text(SEVERAL)
    with pytest.raises(InputError):
        update_moses_ini(str(ini), "/m/nope.gz", new_table_path="/m/new.gz")
    assert ini.read_text() == SEVERAL
    assert [p.name for p in tmp_path.iterdir()] == ["moses.ini"]
