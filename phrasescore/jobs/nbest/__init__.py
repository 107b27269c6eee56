"""The n-best column: ``nbest`` (:mod:`.nbest`) adds the models' log p to every hypothesis of a
Moses n-best list, the list scored as a chunked job (:mod:`.job`) with the features that
:mod:`.features` loads and scores, each chunk written by :mod:`.writer`."""
