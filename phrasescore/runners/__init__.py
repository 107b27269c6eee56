"""How a job's work is spread and written: the chunked job that rescore and nbest share
(``chunked_job``: lock, checks, worker map, shard manifest, publish), its outputs (``partial``:
a resumable partial file; ``streams``: standard output and streams), forked worker processes
(``chunk_pool``, ``workers``), shards of one input, their manifests and their merge
(``shards``, ``merge``), and torchrun ranks (``distributed``).
"""
