"""One module per command: each wires the Moses formats, the text layer, the engine and the
model together for one ``phrasescore`` subcommand, callable without the CLI.

What jobs share lives beside them: :mod:`.common` (the model a job was handed or loads),
:mod:`.figures` (matplotlib figures written atomically).
"""
