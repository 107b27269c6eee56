"""The jobs, one folder per product: each job wires the Moses formats, the text layer, the engine
and the model together for one ``phrasescore`` subcommand, callable without the CLI, and returns a
result whose ``lines()`` is the summary the command prints.

Products: :mod:`.rescore` (the phrase-table column: ``rescore``, ``merge-shards``,
``check-table``, ``copy-table``, ``ini-tables``), :mod:`.nbest` (the n-best column: ``nbest``),
:mod:`.tuning` (``ab``, ``rerank-tune``, ``rerank-weights``), :mod:`.analysis` (``info``,
``translate``, ``evaluate``, ``sample``, ``represent``, ``compare``, ``align``) and
:mod:`.training` (``train``, ``train-lm``), and :mod:`.recipe` (``recipe``: the others' commands as
the steps of one resumable run).

A job imports its own folder, the modules that the products share here and the layers below,
never another product's folder (tests/test_packaging.py): ``common`` (the model a job was handed
or loads), ``bleu`` (sacrebleu's BLEU and chrF). The training loop of ``train`` and ``train-lm``
is its own part, :mod:`phrasescore.training`; figures written atomically are
:mod:`phrasescore.figures`.
"""
