"""Split a long list of checkpoint checks over forked processes (the quick level of `validate` and `prune`).

The checks of one checkpoint are Python work on a few small reads: one process keeps one core busy. With
`map_split`, the list is cut into chunks of a few dozen items and handed to a `concurrent.futures`
ProcessPoolExecutor of forked workers (the "fork" context: a worker inherits the list and the work function, so
nothing but a chunk's number crosses to it). This process takes chunks too, from the other end of the list; each
chunk is claimed once (a flag per chunk in memory shared with the workers), so each process, this one included,
simply takes fewer chunks when it gets less of its core. A worker sends a chunk's results back as bytes (`encode`, e.g.
pydantic's JSON), which this process decodes and validates again (`decode`), counting them on the progress bar as
they come. Nothing changes in what is checked or reported: the results are the ones a single process gives
(tests/test_checkpoints_fanout.py compares them).

It forks only where forking is safe and worth it: on a platform with `os.fork`, from a process running one
thread (a fork copies only the calling thread: a lock held by another, an object-storage client's event
loop, a training framework's workers would be left broken in the child; the executor forks every worker at its
first submit, before it starts a thread of its own), with at least `MIN_ITEMS` items and two usable cores
(`archive.usable_cores`: affinity and cgroup quota), or fewer items that are slow (`PROBE`, `SLOW_REST`). A worker
that fails in any way (an exception, killed, results that do not decode or have the wrong count) is not trusted:
every chunk it delivered is redone here, with every chunk no trusted worker delivered, as when no pool can be
started (no descriptor, no process left). Workers are always reaped; on an interrupt they are killed first.
`CHECKPOINT_STRATEGY_PROCESSES=1` turns the split off (a cap: N processes at most).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from checkpoint_strategy.formats.archive import usable_cores

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

T = TypeVar("T")
R = TypeVar("R")

#: from this many items the list is split (a fork and the round trip cost ~2 ms + ~25 us an item)
MIN_ITEMS = 256
#: fewer items split too when they are slow (a real Trainer checkpoint's optimizer.pt pickle alone is ~15-30 ms at
#: the quick level, ~100x the bench tree's synthetic ones): the first PROBE items are checked here one by one, and
#: the rest split when, at the quicker of those items' pace, they would take this process SLOW_REST seconds or more
PROBE = 2
SLOW_REST = 0.1
#: the probe's clock (tests put a fake one here: an item's cost is then what the test says, whatever the load)
clock: Callable[[], float] = time.perf_counter
#: at most this many processes, this one included
MAX_WORKERS = 8
#: False turns the split off (tests compare both ways)
ENABLED = True
#: at most this many chunks (each costs a round trip to a worker)
MAX_CHUNKS = 1024
#: items a chunk has at least (fewer: the round trips cost more than they balance; tests set 1 for many chunks)
MIN_CHUNK = 4

Work = Callable[[Sequence[T], bool], list[R]]

#: what the forked workers check: (items, chunks, work, encode), set here before the pool forks them
_JOB: (
    tuple[Sequence[Any], list[tuple[int, int]], Work[Any, Any], Callable[[list[Any]], bytes], Any]
    | None
) = None


def workers_for(n: int) -> int:
    """How many processes (this one included) check `n` items: 1 unless forking is safe and worth it.
    CHECKPOINT_STRATEGY_PROCESSES=N caps the count (1: never split; a machine shared with a training job)."""
    if n < MIN_ITEMS:
        return 1
    return min(_allowed(), n // (MIN_ITEMS // 2))


def _allowed() -> int:
    """Processes this one may use, itself included: 1 where a fork is not safe (no `os.fork`, another thread
    running) or the split is off; else the usable cores, at most MAX_WORKERS and CHECKPOINT_STRATEGY_PROCESSES."""
    if not ENABLED or not hasattr(os, "fork") or threading.active_count() != 1:
        return 1
    cap = MAX_WORKERS
    raw = os.environ.get("CHECKPOINT_STRATEGY_PROCESSES", "").strip()
    if raw.isdigit():
        cap = max(1, min(cap, int(raw)))
    return max(1, min(cap, usable_cores()))


def map_split(
    items: Sequence[T],
    work: Work[T, R],
    encode: Callable[[list[R]], bytes],
    decode: Callable[[bytes], list[R]],
    progress: Callable[[int], None] | None = None,
) -> list[R]:
    """`work(items, True)`, the items split over `workers_for(len(items))` processes in chunks.
    `work(chunk, here)`: the results of one chunk (`here`: False in a worker, which must not touch the terminal,
    e.g. a progress bar, and here for a chunk `progress` already counted); `encode` turns a chunk's results into
    bytes in a worker, `decode` back in this process (ValueError, TypeError or KeyError: bytes it does not take;
    that worker's chunks are checked here). `progress(k)`: called here as k more items come back from a worker
    (what `work` counts itself when `here`), each item once."""
    n = workers_for(len(items))
    if n == 1:
        return _probe(items, work, encode, decode, progress)
    return _split(items, n, _chunks(len(items), n), work, encode, decode, progress)


def _probe(
    items: Sequence[T],
    work: Work[T, R],
    encode: Callable[[list[R]], bytes],
    decode: Callable[[bytes], list[R]],
    progress: Callable[[int], None] | None,
) -> list[R]:
    """Fewer than MIN_ITEMS: the first PROBE items here, each timed; the rest split (a chunk an item) when they
    would take SLOW_REST seconds here at the quicker one's pace, else here too. (Two items: the first may pay a
    one-time cost, a model's first validation or a cold cache.)"""
    rest = len(items) - PROBE
    if rest < 2 or not ENABLED:
        return work(items, True)
    done: list[R] = []
    pace = float("inf")
    for k in range(PROBE):
        start = clock()
        done += work(items[k : k + 1], True)
        pace = min(pace, clock() - start)
    n = min(_allowed(), rest) if pace * rest >= SLOW_REST else 1
    if n == 1:
        return done + work(items[PROBE:], True)
    return done + _split(
        items[PROBE:], n, [(a, a + 1) for a in range(rest)], work, encode, decode, progress
    )


def _chunks(count: int, workers: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk: 8 or more a process (uneven cores even out), MIN_CHUNK to 32 items each (a chunk
    costs one round trip), at most MAX_CHUNKS of them."""
    size = max(MIN_CHUNK, min(32, count // (workers * 8)), -(-count // MAX_CHUNKS))
    return [(a, min(count, a + size)) for a in range(0, count, size)]


Outcome = tuple[
    int, str, "bytes | None"
]  # (worker pid, "done" / "failed" / "skipped", the results as bytes)


def _worker_chunk(i: int) -> Outcome:
    """In a worker: chunk i's results as bytes, with this worker's pid; "skipped" when this process took the chunk
    first, "failed" when the work raised."""
    assert _JOB is not None  # (set before the fork)
    items, chunks, work, encode, claims = _JOB
    if not _claim(claims, i):
        return os.getpid(), "skipped", None
    try:
        return os.getpid(), "done", encode(work(items[chunks[i][0] : chunks[i][1]], False))
    except Exception:  # noqa: BLE001 - any failure: this worker is not trusted, its chunks are redone
        return os.getpid(), "failed", None


def _claim(claims: Any, i: int) -> bool:
    """Take chunk i for the calling process (a flag per chunk in memory the workers share): False when another
    process took it first."""
    with claims.get_lock():
        if claims[i]:
            return False
        claims[i] = 1
        return True


@dataclass
class _Gathered(Generic[R]):
    """The workers' results as they come back: by chunk, with the pid that sent each; the pids not trusted; the
    chunks counted on the progress bar."""

    size: list[int]
    decode: Callable[[bytes], list[R]]
    progress: Callable[[int], None] | None
    got: dict[int, tuple[int, list[R]]] = field(default_factory=dict)
    untrusted: set[int] = field(default_factory=set)
    counted: set[int] = field(default_factory=set)

    def take(self, i: int, fut: Future[Outcome]) -> None:
        """Chunk i's future, done: its results kept when they decode to as many as it has items (counted on the
        bar), else its worker is not trusted; a future without a result (a worker killed) is redone here."""
        try:
            pid, status, payload = fut.result()
        except Exception:  # noqa: BLE001 - BrokenProcessPool, a result that did not unpickle: redone here
            return
        if status == "skipped":  # (this process checked it)
            return
        results = _decoded(payload, self.decode, self.size[i])
        if results is None:
            self.untrusted.add(pid)
            return
        self.got[i] = (pid, results)
        if self.progress is not None:
            self.counted.add(i)
            self.progress(len(results))

    def trusted(self) -> dict[int, list[R]]:
        """The chunks delivered by workers that delivered nothing wrong."""
        return {i: res for i, (pid, res) in self.got.items() if pid not in self.untrusted}


def _decoded(
    payload: bytes | None, decode: Callable[[bytes], list[R]], size: int
) -> list[R] | None:
    """A worker's bytes for a chunk of `size` items decoded (validated again), or None when they are not that."""
    if payload is None:
        return None
    try:
        results = decode(payload)
    except (ValueError, TypeError, KeyError):
        return None
    return results if isinstance(results, list) and len(results) == size else None


def _split(
    items: Sequence[T],
    n: int,
    chunks: list[tuple[int, int]],
    work: Work[T, R],
    encode: Callable[[list[R]], bytes],
    decode: Callable[[bytes], list[R]],
    progress: Callable[[int], None] | None,
) -> list[R]:
    """`work` over `chunks` of `items` by this process and a pool of up to n - 1 forked workers."""
    global _JOB
    done: dict[int, list[R]] = {}
    gathered: _Gathered[R] = _Gathered([b - a for a, b in chunks], decode, progress)
    pool, claims = _pool(min(n, len(chunks)) - 1, len(chunks))
    _JOB = (items, chunks, work, encode, claims)
    aborted = True
    try:
        futures = _submit(pool, len(chunks)) if pool is not None else {}
        shared = bool(futures)
        for i in reversed(
            range(len(chunks))
        ):  # this process takes chunks from the end, the workers from the start
            if shared and not _claim(claims, i):
                continue
            done[i] = work(items[chunks[i][0] : chunks[i][1]], True)
            for k in [k for k, f in futures.items() if f.done()]:
                gathered.take(k, futures.pop(k))
        for k, fut in futures.items():
            gathered.take(k, fut)  # (waits for each)
        done.update({i: r for i, r in gathered.trusted().items() if i not in done})
        for i, (a, b) in enumerate(chunks):  # what no trusted worker delivered (or no pool): here
            if i not in done:
                done[i] = work(items[a:b], i not in gathered.counted)
        aborted = False
        return [r for i in range(len(chunks)) for r in done[i]]
    finally:
        _JOB = None
        if pool is not None:
            _close(pool, aborted)


def _pool(workers: int, count: int) -> tuple[ProcessPoolExecutor | None, Any]:
    """A pool of `workers` forked processes and the claim flags of `count` chunks they share with this one, or
    (None, None): none wanted, or no descriptor or shared memory for them."""
    if workers < 1:
        return None, None
    from concurrent.futures import ProcessPoolExecutor  # only where a split happens (start-up time)

    ctx = multiprocessing.get_context("fork")
    try:
        claims = ctx.Array("b", count, lock=True)
        return ProcessPoolExecutor(
            max_workers=workers,
            mp_context=ctx,
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        ), claims
    except OSError:
        return None, None


def _die_with_parent(parent: int) -> None:
    """A worker ends when the process that forked it does (Linux: PR_SET_PDEATHSIG). A worker inherits every
    descriptor, the prune's folder lock included: a prune killed mid-survey must not leave workers that hold the
    lock (the next prune would wait on it forever). Elsewhere the pool's own pipes end the workers."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was set up
        os._exit(1)


def _submit(pool: ProcessPoolExecutor, count: int) -> dict[int, Future[Outcome]]:
    """Every chunk submitted (the first submit forks the workers); {} when they cannot be forked (out of
    processes or descriptors): this process checks everything."""
    gc.freeze()  # the objects this process has now are left alone by the workers' collections (no copy)
    try:
        return {i: pool.submit(_worker_chunk, i) for i in range(count)}
    except OSError:
        _close(pool, True)
        return {}
    finally:
        gc.unfreeze()


def _close(pool: ProcessPoolExecutor, kill: bool) -> None:
    """Shut the pool down and reap its workers; `kill`: an interrupt or an error here, or a pool that could not
    start: its workers are killed first (what was collected is done)."""
    procs = list(
        (getattr(pool, "_processes", None) or {}).values()
    )  # (the executor drops them at shutdown)
    if kill:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    pool.shutdown(
        wait=True
    )  # (no future is cancelled: a pool that breaks then sets each one's exception)
    for proc in procs:  # (a pool that broke may leave a worker waiting for work: it is killed)
        if proc.is_alive():
            proc.kill()
        proc.join()
