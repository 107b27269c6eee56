"""The phrase-table column: ``rescore`` (:mod:`.rescore`, reading the table in :mod:`.chunks`,
scoring :mod:`.columns`, writing a resumable :mod:`.partial` output), the new moses.ini
(:mod:`.ini_update`), ``merge-shards`` (:mod:`.merge_shards`) and the Moses-file commands
``check-table``, ``copy-table`` and ``ini-tables`` (:mod:`.tables`)."""
