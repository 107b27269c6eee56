"""``--workers N`` and torchrun for the scoring jobs (``rescore``, ``nbest``): the options
checked the same way, and the chunks scored in this process or in a pool of forked workers
(:mod:`.chunk_pool`) with the same bytes either way.

A job loads its models inside :func:`loading_for_workers` (one PyTorch thread when it will fork),
then scores its chunks with :class:`WorkerMap`::

    with WorkerMap(score_chunk, workers, warm_up=columns.warm_up) as scoring:
        for chunk, result in scoring.results(chunks):
            ...  # in input order
        scoring.finish()  # the last result is in: let the workers exit
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from phrasescore.errors import InputError, RunStopped
from phrasescore.runners.chunk_pool import ChunkPool, WorkerDied, single_threaded_parent


def check_torchrun_options(launch, shard, workers: int) -> None:
    """Under torchrun (``launch`` not None) there is no ``--shard`` nor ``--workers``: torchrun
    gives each rank its shard and starts the processes."""
    if launch is None:
        return
    if shard is not None:
        raise InputError("--shard and torchrun exclude each other (torchrun gives each rank one)")
    if workers > 1:
        raise InputError(
            "--workers and torchrun exclude each other (torchrun starts the processes)"
        )


def check_workers_device(workers: int, device) -> None:
    """``--workers`` > 1 forks CPU processes: refused on another device."""
    if workers > 1 and device.type != "cpu":
        raise InputError(
            f"--workers is for scoring on the CPU; on {device.type} use one process "
            "(--io-workers N: N processes parse and write while it scores)"
        )


def check_io_workers(workers: int, io_workers: int) -> None:
    """``--io-workers`` (this process scores) and ``--workers`` > 1 (the workers score)
    exclude each other."""
    if io_workers < 0:
        raise InputError("--io-workers must be 0 or more")
    if io_workers and workers > 1:
        raise InputError(
            "--workers and --io-workers exclude each other (--workers: the processes score; "
            "--io-workers: this process scores, they parse and write)"
        )


def loading_for_workers(workers: int) -> AbstractContextManager:
    """Where a job loads its models: at one PyTorch thread when it will fork workers from this
    process (:func:`~.chunk_pool.single_threaded_parent`)."""
    return single_threaded_parent(workers > 1)


class WorkerMap:
    """A map of a job's ``score`` (its ``ChunkScorer``) over the chunks: in this process
    (``workers`` = 1) or in ``workers`` forked single-threaded processes, the results in input
    order.

    ``warm_up`` (optional) compiles the kernels in this process before the fork, so that the
    workers inherit them. With ``serve`` the chunks are ``score(chunk, ask)``, ``ask`` answered
    by ``serve`` in this process (``rescore --io-workers``: this process owns the networks),
    from ``workers`` >= 1 processes; in this process alone (``workers`` = 0) ``score(chunk)``. A worker that dies becomes :class:`~phrasescore.errors.RunStopped`
    whose message ends with ``again`` (what the user does next); on any error the workers are
    stopped at once.
    """

    def __init__(
        self,
        score: Callable[[Any], Any],
        workers: int,
        warm_up: Callable[[], None] | None = None,
        label: Callable[[int, Any], str] | None = None,
        again: str = "run again",
        serve: Callable[[Any], Any] | None = None,
    ):
        self.score = score
        self.serve = serve
        self.workers = workers
        self.warm_up = warm_up
        self.label = label
        self.again = again
        self.pool: ChunkPool | None = None

    def __enter__(self) -> WorkerMap:
        if self.workers > 1 or (self.serve is not None and self.workers > 0):
            with single_threaded_parent(True):
                if self.warm_up is not None:
                    self.warm_up()  # compiled here once: the forked workers inherit the kernels
                self.pool = ChunkPool(self.score, self.workers, label=self.label, serve=self.serve)
        return self

    def results(self, chunks: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """``(chunk, score(chunk))`` for each chunk, in input order."""
        if self.pool is None:
            return ((chunk, self.score(chunk)) for chunk in chunks)
        return self.pool.imap(chunks)

    def finish(self) -> None:
        """After the last result: let the workers exit."""
        if self.pool is not None:
            self.pool.close()

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pool is not None:
            self.pool.terminate()  # stopped already after the last chunk; at once after an error
        if isinstance(exc, WorkerDied):
            raise RunStopped(f"{exc}; {self.again}") from None
