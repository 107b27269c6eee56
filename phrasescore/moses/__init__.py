"""Moses file formats: phrase tables, n-best lists and moses.ini.

This package knows the formats only (it never imports torch and knows nothing about models):

* :mod:`phrasescore.moses.phrase_table` reads phrase tables as a stream and writes them back with
  extra score columns, byte-identical otherwise;
* :mod:`phrasescore.moses.nbest` reads n-best lists, writes new lines, adds a feature to a line
  and recomputes total scores from a moses.ini's weights (and writes them in the total field);
* :mod:`phrasescore.moses.tuning` reads and writes the files of Moses' tuners (the extractor's
  ``features.dat``, mert's ``init.opt`` and ``weights.txt``, kbmira's output) and ``Name= w``
  weights files;
* :mod:`phrasescore.moses.ini` reads moses.ini (its phrase tables, its weights) and updates it so
  that a phrase table declares more features and weights (modern ``[feature]``/``[weight]`` and
  old ``[ttable-file]``/``[weight-t]`` formats);
* :mod:`phrasescore.moses.ini_tables` lists the phrase tables of a moses.ini with resolved paths,
  one tab-separated row each, for shell scripts.
"""

from phrasescore.moses.ini import (
    IniUpdate,
    count_features_and_weights,
    list_phrase_tables,
    update_moses_ini,
    update_moses_ini_text,
)
from phrasescore.moses.nbest import (
    NBestEntry,
    add_feature,
    format_feature_value,
    format_nbest_line,
    iter_nbest_groups,
    parse_features,
    read_nbest,
    read_weights,
    total_score,
    with_feature,
)
from phrasescore.moses.phrase_table import (
    PhraseTableEntry,
    PhraseTableWriter,
    TableStats,
    check_phrase_table,
    copy_phrase_table,
    format_entry,
    format_probability,
    iter_source_groups,
    probability_from_logprob,
    read_phrase_table,
    write_phrase_table,
)

__all__ = [
    "IniUpdate",
    "NBestEntry",
    "PhraseTableEntry",
    "PhraseTableWriter",
    "TableStats",
    "add_feature",
    "check_phrase_table",
    "copy_phrase_table",
    "count_features_and_weights",
    "format_entry",
    "format_feature_value",
    "format_nbest_line",
    "format_probability",
    "iter_nbest_groups",
    "iter_source_groups",
    "list_phrase_tables",
    "parse_features",
    "probability_from_logprob",
    "read_nbest",
    "read_phrase_table",
    "read_weights",
    "total_score",
    "update_moses_ini",
    "update_moses_ini_text",
    "with_feature",
    "write_phrase_table",
]
