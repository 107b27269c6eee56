"""One module per command: each wires the Moses formats, the text layer, the engine and the
model together for one ``phrasescore`` subcommand, callable without the CLI, and returns a result
whose ``lines()`` is the summary the command prints.

Commands: ``train``, ``train_lm``, ``info``, ``rescore``, ``merge_shards``, ``nbest``,
``translate``, ``evaluate``, ``sample``, ``represent``, ``compare``, ``align``, ``tables``
(``check-table``, ``copy-table``, ``ini-tables``) and ``ab``.

Parts of one job: ``rescore_columns``, ``rescore_chunks`` and ``rescore_partial`` (of
``rescore``), ``ab_rerank`` (of ``ab``).

What several jobs share: ``common`` (the model a job was handed or loads), ``bleu`` (sacrebleu's
BLEU and chrF), ``ini_update`` (the moses.ini of a new table, for ``rescore`` and
``merge-shards``). The training loop of ``train`` and ``train-lm`` is its own part,
:mod:`phrasescore.training`; figures written atomically are :mod:`phrasescore.figures`.
"""
