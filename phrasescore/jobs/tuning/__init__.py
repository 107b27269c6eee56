"""Tuning with Moses: the ``ab`` comparison of systems (:mod:`.ab`, its re-ranking step
:mod:`.ab_rerank`), ``rerank-tune`` and ``rerank-weights`` (:mod:`.rerank_tune`,
:mod:`.ab_rerank`) and Moses' own programs as they run them (:mod:`.moses_tools`)."""
