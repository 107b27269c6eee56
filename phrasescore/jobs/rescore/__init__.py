"""The phrase-table column: ``rescore`` (:mod:`.rescore`, the table scored as a chunked job in
:mod:`.job`, read in :mod:`.chunks`, scored in :mod:`.columns`), the new moses.ini
(:mod:`.ini_update`), ``merge-shards`` (:mod:`.merge_shards`) and the Moses-file commands
``check-table``, ``copy-table`` and ``ini-tables`` (:mod:`.tables`)."""
