"""The n-best column: ``nbest`` (:mod:`.nbest`) adds the models' log p to every hypothesis of a
Moses n-best list, with the features that :mod:`.features` loads and scores."""
