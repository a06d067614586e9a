"""Split a long list of checkpoint checks over forked processes (the quick level of `validate` and `prune`).

The checks of one checkpoint are Python work on a few small reads: one process keeps one core busy. With
`map_split`, this process checks the first part of the list and forked children check the others, each on
its own core; every child sends its results back as bytes through a pipe (`encode`, e.g. JSON), and they are put
back in order.
Nothing changes in what is checked or reported: the results are the ones a single process gives
(tests/test_checkpoints_fanout.py compares them).

It forks only where forking is safe and worth it: on a platform with `os.fork`, from a process running one
thread (a fork copies only the calling thread: a lock held by another, an object-storage client's event
loop, a training framework's workers would be left broken in the child), with at least `MIN_ITEMS` items and
two usable cores (`filechecks.usable_cores`: affinity and cgroup quota). A child that fails in any way
(an exception, killed, output that does not parse) is not trusted: this process checks that part itself, as
it does a part whose fork failed (no descriptor, no process left).
Children are always reaped; on an interrupt they are killed first. `CHECKPOINT_STRATEGY_PROCESSES=1` turns the
split off (a cap: N processes at most).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from checkpoint_strategy.checkpoints.filechecks import usable_cores

T = TypeVar("T")
R = TypeVar("R")

#: fewer items than this are checked in this process (a fork and the round trip cost ~2 ms + ~25 us an item)
MIN_ITEMS = 256
#: at most this many processes, this one included
MAX_WORKERS = 8
#: False turns the split off (tests compare both ways)
ENABLED = True


def workers_for(n: int) -> int:
    """How many processes (this one included) check `n` items: 1 unless forking is safe and worth it.
    CHECKPOINT_STRATEGY_PROCESSES=N caps the count (1: never split; a machine shared with a training job)."""
    if not ENABLED or n < MIN_ITEMS or not hasattr(os, "fork") or threading.active_count() != 1:
        return 1
    cap = MAX_WORKERS
    raw = os.environ.get("CHECKPOINT_STRATEGY_PROCESSES", "").strip()
    if raw.isdigit():
        cap = max(1, min(cap, int(raw)))
    return max(1, min(cap, usable_cores(), n // (MIN_ITEMS // 2)))


def map_split(items: Sequence[T], work: Callable[[Sequence[T], bool], list[R]], encode: Callable[[list[R]], bytes],
              decode: Callable[[bytes], list[R]]) -> list[R]:
    """`work(items, True)`, the items split over `workers_for(len(items))` processes in contiguous parts.
    `work(part, here)`: the results of one part (`here`: False in a child, which must not touch the terminal,
    e.g. a progress bar); `encode` turns a part's results into bytes in the child, `decode` back in this process
    (ValueError, TypeError or KeyError: bytes it does not take; that part is checked here)."""
    n = workers_for(len(items))
    if n == 1:
        return work(items, True)
    size = -(-len(items) // n)
    parts = [items[i:i + size] for i in range(0, len(items), size)]
    children: list[_Child] = []
    try:
        gc.freeze()   # the objects this process has now are left alone by the children's collections (no copy)
        try:
            for part in parts[1:]:
                children.append(_fork(part, work, encode))
        finally:
            gc.unfreeze()
        results = work(parts[0], True)
        for child in children:
            results.extend(_collect(child, work, decode))
        return results
    finally:
        for child in children:   # an interrupt or an error here: stop the rest (the collected ones are done)
            _stop(child)


@dataclass
class _Child:
    """One part and the process checking it: `pid` 0 once reaped (or when the fork failed: checked here), `fd` the
    read end of its pipe, -1 once closed."""

    pid: int
    fd: int
    part: Sequence


def _fork(part: Sequence[T], work: Callable[[Sequence[T], bool], list[R]],
          encode: Callable[[list[R]], bytes]) -> _Child:
    try:
        r, w = os.pipe()
    except OSError:   # out of descriptors: this part is checked here
        return _Child(0, -1, part)
    try:
        pid = os.fork()
    except OSError:   # out of processes or memory: the same
        os.close(r)
        os.close(w)
        return _Child(0, -1, part)
    if pid == 0:   # the child: results to the pipe, then out without running this process's exit handlers
        code = 1
        try:
            os.close(r)
            data = encode(work(part, False))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return _Child(pid, r, part)


def _collect(child: _Child, work: Callable[[Sequence[T], bool], list[R]],
             decode: Callable[[bytes], list[R]]) -> list[R]:
    """A child's results, or its part checked here when the child did not deliver all of them."""
    if not child.pid:
        return work(child.part, True)
    chunks = []
    try:
        while True:
            chunk = os.read(child.fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(child.fd)
        child.fd = -1
    _pid, status = os.waitpid(child.pid, 0)
    child.pid = 0
    if os.waitstatus_to_exitcode(status) == 0:
        try:
            got = decode(b"".join(chunks))
            if len(got) == len(child.part):
                return got
        except (ValueError, TypeError, KeyError):
            pass
    return work(child.part, True)


def _stop(child: _Child) -> None:
    if child.pid:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except OSError:
            pass
    if child.fd >= 0:
        try:
            os.close(child.fd)
        except OSError:
            pass
        child.fd = -1
    if child.pid:
        try:
            os.waitpid(child.pid, 0)
        except OSError:
            pass
        child.pid = 0
