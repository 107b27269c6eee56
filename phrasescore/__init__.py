"""phrasescore: neural phrase scores for Moses phrase tables (Cho et al. 2014)."""

__version__ = "0.1.0"
