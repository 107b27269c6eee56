"""Chunks of work done in several single-threaded processes, results in input order.

``rescore --workers N`` scores its chunks in N processes of one PyTorch thread each instead of
one process with N intra-op threads. On a few cores that scores more pairs per CPU-second and
keeps every core busy: the model's products are small enough that a second thread inside them
mostly waits, and the text work around them (parsing, token ids, formatting, gzip) is Python,
which one process runs on one core at a time. docs/scaling.md "Every core of one machine" and docs/benchmarks.md have the figures.

How (:class:`ChunkPool`):

- The workers are *forked* after the models are loaded: they share the parent's weights, its
  imported PyTorch and its compiled kernels copy-on-write instead of loading their own.
- The parent runs PyTorch with one thread while it loads the models and while it warms the
  kernels up and forks (:func:`single_threaded_parent`; nothing in between runs PyTorch): an
  OpenMP thread pool does not survive ``fork`` (the child's first parallel region would wait
  for threads that do not exist), and a pool is only created by a parallel region of more than
  one thread. Each worker then sets its own threads.
  TorchInductor's compile thread pool does not survive it either: parent and workers compile
  in their own thread (:func:`compile_in_process`), and the parent warms the kernels up before
  the fork so that the workers seldom compile at all. (A library caller that has run PyTorch
  with several threads before must not fork workers from that process.)
- One task queue, one result queue: a free worker takes the next chunk; the parent hands the
  results on in input order and keeps at most ``IN_FLIGHT_PER_WORKER`` chunks per worker
  queued or being scored, so memory stays bounded whatever the input's length.
- With ``serve`` (``rescore --io-workers``) the parent owns part of the work: the
  networks, on a GPU. A worker calls ``work(item, ask)``; ``ask(request)`` puts the request on
  one request queue and waits for the answer on its own pipe; the parent, while it waits for
  results, answers each request as it comes with ``serve(request)`` (in its own thread, where
  the GPU is). A worker has at most one request out, so at most ``workers`` requests wait,
  and the in-flight bound above holds with ``serve`` too: memory stays flat. The answer to a request
  depends only on the request, so the bytes do not depend on the order of service.
- The same chunk gives the same result in whichever worker scores it (same code, same weights,
  same thread count), so the output bytes do not depend on the scheduling.
- Failures: an :class:`~phrasescore.errors.InputError` in a worker is raised again in the parent
  (same message, path and line) when that chunk's turn comes, so the first bad chunk in input
  order is the one reported, as in one process; any other exception becomes
  :class:`WorkerError` with the worker's traceback; a worker that dies (killed, out of memory)
  is noticed at once (the parent waits on the workers' ends as on their results, so the other
  workers' results do not hold it up) and raises :class:`WorkerDied` (which worker, how, at
  which chunk) instead of waiting for ever. Workers ignore SIGINT and take SIGTERM's default: Ctrl-C
  (or SIGTERM, which the command takes as Ctrl-C) interrupts the parent, which stops them.
  SIGINT and SIGTERM are blocked while the parent forks and until the worker has set them so
  (the first thing it does): a worker stopped at once, during its start (the parent found an
  input error at line 123), dies quietly instead of running the parent's handler and printing
  its traceback.
- Workers die with the parent, however it ends (SIGKILL included): on Linux the kernel sends
  them SIGKILL when it exits (``prctl(PR_SET_PDEATHSIG)``), and everywhere each worker watches
  a pipe whose only writer is the parent: end of file means the parent is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import connection
from typing import Any

import torch

from phrasescore.errors import InputError

log = logging.getLogger(__name__)

IN_FLIGHT_PER_WORKER = 2
"""Chunks per worker queued or being scored: one to work on, one waiting, so no worker idles
while the parent writes."""
POLL_SECONDS = 1.0
"""How long the parent waits for a result or a worker's end before it looks again (a safety
net: either wakes it at once)."""


class WorkerError(RuntimeError):
    """A worker process failed for a reason other than the input (a bug in the work)."""


class WorkerDied(RuntimeError):
    """A worker process ended before its work was done (killed, out of memory)."""

    def __init__(self, worker: int, exitcode: int, chunk: str | None):
        self.worker = worker
        self.exitcode = exitcode
        self.chunk = chunk
        if exitcode < 0:
            how = f"signal {-exitcode}" + (
                "; out of memory?" if -exitcode == signal.SIGKILL else ""
            )
        else:
            how = f"exit code {exitcode}"
        at = f" at {chunk}" if chunk is not None else ""
        super().__init__(f"worker {worker} died ({how}){at}")


PR_SET_PDEATHSIG = 1
IDLE = -1
"""A worker's entry in the pool's table of current tasks while it has none."""


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@functools.cache
def _libc():
    """The C library (for ``prctl``), looked up once in the parent before it forks: the lookup
    runs ``ldconfig``, slow enough to matter in every worker's start; None if not found."""
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError, AttributeError, TypeError):
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return None


def _die_with_parent(parent: int, parent_alive) -> None:
    """Make this worker end when the parent process does (see the module docstring)."""
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(OSError, AttributeError, TypeError):
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent was gone before prctl took effect
        os._exit(1)

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(parent_alive, 1):
                pass
        os._exit(1)  # end of file: the parent, the pipe's only writer, is gone

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@contextlib.contextmanager
def single_threaded_parent(active: bool):
    """PyTorch at one thread in this process while the block runs (loading the models, and
    warming up and forking: see the module docstring), the thread count restored after."""
    if not active:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    compile_in_process()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def frozen_heap():
    """The objects that exist now left out of the garbage collector's scans while the block
    runs (``gc.freeze``), the way a worker runs: a job that makes millions of small objects
    (a table's lines, tokens and ids) otherwise rescans the loaded models and vocabularies at
    every full collection (docs/benchmarks.md, "Table I/O"). Objects made in the block are
    collected as usual; the frozen ones are given back to the collector after it."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def compile_in_process() -> None:
    """Make torch.compile build kernels in this thread: TorchInductor's compile thread pool is
    created once per process and a forked worker inherits it without its threads (a compile in
    the worker would wait for them for ever)."""
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.compile_threads = 1


def _worker_main(
    work: Callable[[Any], Any],
    threads: int,
    tasks,
    results,
    slot: int,
    current,
    parent: int,
    pipe: tuple[int, int],
    asker: _Asker | None = None,
) -> None:
    """A worker: take (index, item) from ``tasks`` until None, put (index, ok, value); while
    it works on a task, ``current[slot]`` holds the task's index. With ``asker`` the work is
    ``work(item, ask)`` (``ask`` answered by the parent's ``serve``)."""
    # first of all (SIGINT and SIGTERM are blocked since the fork): the parent's handlers are
    # not for a worker; a SIGTERM that came meanwhile ends it now, quietly
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    os.close(pipe[1])  # the parent alone holds the write end: EOF when it is gone
    gc.freeze()  # the inherited heap (models, vocabularies) is never garbage: never scanned
    _die_with_parent(parent, pipe[0])
    torch.set_num_threads(threads)
    compile_in_process()
    if asker is not None:
        ask = functools.partial(asker.ask, slot)
        work = functools.partial(_work_asking, work, ask)
    while (task := tasks.get()) is not None:
        index, item = task
        current[slot] = index
        try:
            results.put((index, True, work(item)))
        except InputError as exc:
            results.put((index, False, ("input", exc.message, exc.path, exc.line)))
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            results.put((index, False, ("crash", traceback.format_exc(), None, None)))
        current[slot] = IDLE


def _work_asking(work: Callable[[Any, Any], Any], ask: Callable[[Any], Any], item: Any) -> Any:
    return work(item, ask)


class ChunkPool:
    """``workers`` forked processes, each running ``work`` with ``threads`` PyTorch threads.

    Use as a context manager; :meth:`imap` yields ``(item, work(item))`` in input order.
    ``work`` and whatever it refers to (the loaded models) are inherited by the fork, never
    pickled; only the items and the results travel, through pipes.
    """

    def __init__(
        self,
        work: Callable[[Any], Any],
        workers: int,
        threads: int = 1,
        label: Callable[[int, Any], str] | None = None,
        serve: Callable[[Any], Any] | None = None,
    ):
        """``label(index, item)`` names an item in :class:`WorkerDied` (default: ``chunk
        INDEX``, 0-based in input order). ``serve``: what this process answers the workers'
        requests with (the work is then ``work(item, ask)``; see the module docstring)."""
        if workers < (1 if serve is not None else 2):
            raise ValueError("a ChunkPool needs at least 2 workers (1 with serve)")
        context = multiprocessing.get_context("fork")
        self.label = label or (lambda index, item: f"chunk {index}")
        self.tasks = context.Queue()
        self.results = context.Queue()
        self.serve = serve
        self.asker = _Asker(context, workers) if serve is not None else None
        self.served = 0
        """Requests answered so far."""
        self.most_in_flight = 0
        """The most items sent and not yet yielded at any time (at most :attr:`in_flight_limit`)."""
        self.current = context.RawArray("q", [IDLE] * workers)
        self._pipe = os.pipe()  # workers read; EOF when this process is gone
        self._waiting: dict[int, Any] = {}
        self.processes = [
            context.Process(
                target=_worker_main,
                args=(
                    work,
                    threads,
                    self.tasks,
                    self.results,
                    i,
                    self.current,
                    os.getpid(),
                    self._pipe,
                    self.asker,
                ),
                name=f"phrasescore-worker-{i + 1}",
                daemon=True,
            )
            for i in range(workers)
        ]
        _libc()  # looked up here once, not in every worker
        # blocked in the forks, until each worker has set its own handlers (_worker_main)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            for process in self.processes:
                process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(self._pipe[0])  # the workers have their copies
        log.info("%d worker processes, %d thread(s) each", workers, threads)

    def __enter__(self) -> ChunkPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()

    @property
    def in_flight_limit(self) -> int:
        """Items sent to the workers and not yet yielded, at most: the bound on memory."""
        return IN_FLIGHT_PER_WORKER * len(self.processes)

    def imap(self, items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """``(item, work(item))`` for each item, in input order."""
        limit = self.in_flight_limit
        waiting = self._waiting  # items sent, by index
        done: dict[int, tuple[bool, Any]] = {}  # results that arrived before their turn
        source = iter(items)
        sent = next_out = 0
        exhausted = False
        while True:
            while not exhausted and sent - next_out < limit:
                item = next(source, _END)
                if item is _END:
                    exhausted = True
                    break
                waiting[sent] = item
                self.tasks.put((sent, item))
                sent += 1
                self.most_in_flight = max(self.most_in_flight, sent - next_out)
            if next_out == sent:
                return
            while next_out not in done:
                index, ok, value = self._next_result()
                done[index] = ok, value
            ok, value = done.pop(next_out)
            if not ok:
                kind, message, path, line = value
                if kind == "input":
                    raise InputError(message, path, line)
                raise WorkerError(f"a worker process failed:\n{message}")
            yield waiting.pop(next_out), value
            next_out += 1

    def _next_result(self) -> tuple[int, bool, Any]:
        """The next result to come, or :class:`WorkerDied` as soon as a worker has ended.

        It waits on each worker's sentinel (readable once the process has ended) as on the
        result queue, and a worker's end comes first: a parent that looked at its workers only
        when no result had come for ``POLL_SECONDS`` would miss a death while the other workers
        finish their chunks."""
        ends = {process.sentinel: process for process in self.processes}
        reader = self.results._reader  # the queue's receiving end, what its get() polls
        requests = [self.asker.requests._reader] if self.asker is not None else []
        while True:
            ready = connection.wait([*ends, reader, *requests], timeout=POLL_SECONDS)
            for sentinel in ready:
                if sentinel in ends:
                    ends[sentinel].join(timeout=POLL_SECONDS)  # its exit code, once reaped
            self._check_alive()
            if requests and requests[0] in ready:
                self._answer()
            if reader in ready:
                with contextlib.suppress(queue.Empty):  # another reader took it: wait again
                    return self.results.get(timeout=POLL_SECONDS)

    def _answer(self) -> None:
        """Answer the workers' requests waiting now with ``serve``."""
        while True:
            try:
                slot, request = self.asker.requests.get_nowait()
            except queue.Empty:
                return
            self.asker.answers[slot][1].send(self.serve(request))
            self.served += 1

    def _check_alive(self) -> None:
        for slot, process in enumerate(self.processes):
            if process.exitcode is not None:
                index = self.current[slot]
                item = self._waiting.get(index, _END) if index != IDLE else _END
                chunk = None if item is _END else self.label(index, item)
                raise WorkerDied(slot + 1, process.exitcode, chunk)

    def close(self) -> None:
        """Let the workers finish and exit."""
        for _ in self.processes:
            self.tasks.put(None)
        for process in self.processes:
            process.join(timeout=60)
        self.terminate()

    def terminate(self) -> None:
        """Stop the workers now (an error or Ctrl-C in the parent)."""
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(timeout=10)
        for q in (self.tasks, self.results, *([self.asker.requests] if self.asker else [])):
            q.cancel_join_thread()
            q.close()
        if self._pipe[1] >= 0:
            os.close(self._pipe[1])
            self._pipe = (-1, -1)
        if self.asker is not None:
            self.asker.close()


_END = object()


class _Asker:
    """The workers' way to the parent's ``serve``: one request queue, one answer pipe per
    worker (made before the fork, so that every worker has its own)."""

    def __init__(self, context, workers: int):
        self.requests = context.Queue()
        self.answers = [context.Pipe(duplex=False) for _ in range(workers)]  # (receive, send)

    def close(self) -> None:
        for pair in self.answers:
            for end in pair:
                end.close()

    def ask(self, slot: int, request: Any) -> Any:
        """In worker ``slot``: the parent's ``serve(request)``."""
        self.requests.put((slot, request))
        return self.answers[slot][0].recv()
