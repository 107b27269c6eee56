"""The training commands: ``train`` (:mod:`.train`) and ``train-lm`` (:mod:`.train_lm`); the loop
they share is :mod:`phrasescore.training`."""
