"""Moses file formats: phrase tables, n-best lists and moses.ini.

This package knows the formats only (it never imports torch and knows nothing about models):

* :mod:`phrasescore.moses.phrase_table` reads phrase tables as a stream and writes them back with
  extra score columns, byte-identical otherwise;
* :mod:`phrasescore.moses.nbest` reads n-best lists, adds a feature to a line and recomputes total
  scores from a ``[weight]`` section;
* :mod:`phrasescore.moses.ini` updates moses.ini so that a phrase table declares more features and
  weights (modern ``[feature]``/``[weight]`` and old ``[ttable-file]``/``[weight-t]`` formats).
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
    iter_nbest_groups,
    parse_features,
    read_nbest,
    read_weights,
    total_score,
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
    "write_phrase_table",
]
