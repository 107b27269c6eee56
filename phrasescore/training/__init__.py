"""The training loop ``train`` and ``train-lm`` share (:mod:`phrasescore.training.trainer`):
data, optimiser and learning-rate schedule, validation, early stopping, checkpoints, exact resume;
the CSLM's trainer on top of it (:mod:`phrasescore.training.lm_trainer`).

Engine, not a job: it builds networks (``model/``) from batches of ids (``text/``) and writes
model files (``bundle``); the jobs ``train`` and ``train_lm`` configure it and run it.
"""
