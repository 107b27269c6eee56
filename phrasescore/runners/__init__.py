"""How a job's work is spread: forked worker processes (``chunk_pool``, ``workers``), shards
of one input and their manifests (``shards``), and torchrun ranks (``distributed``).
"""
