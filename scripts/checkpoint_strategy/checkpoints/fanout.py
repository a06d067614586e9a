"""Split a long list of checkpoint checks over forked processes (the quick level of `validate` and `prune`).

The checks of one checkpoint are Python work on a few small reads: one process keeps one core busy. With
`map_split`, the list is cut into chunks of a few dozen items, and this process and forked children, each on
its own core, take the next chunk from a shared queue until none is left: a process that gets less of its core
(another job on the machine, a training run beside it) simply takes fewer chunks. The queue is a pipe holding
every chunk's number as 4 bytes, written before the fork and read 4 bytes at a time (a read of a pipe takes
bytes from its front under the pipe's lock: each number goes to one reader). Every child sends each chunk's
results as soon as it has them, as bytes (`encode`, e.g. JSON) through a pipe of its own, framed by the chunk's
number and the payload's length; this process reads and decodes what has come between chunks of its own, so
at the end little is left to wait for, and puts the chunks back in order. Nothing changes in what is checked
or reported: the results are the ones a single process gives (tests/test_checkpoints_fanout.py compares them).

It forks only where forking is safe and worth it: on a platform with `os.fork`, from a process running one
thread (a fork copies only the calling thread: a lock held by another, an object-storage client's event
loop, a training framework's workers would be left broken in the child), with at least `MIN_ITEMS` items and
two usable cores (`filechecks.usable_cores`: affinity and cgroup quota). A child that fails in any way
(an exception, killed, output that does not parse, a chunk it names twice or that another did) is not trusted:
this process checks every chunk no trusted process delivered, as it does when a fork fails (no descriptor, no
process left).
Children are always reaped; on an interrupt they are killed first. `CHECKPOINT_STRATEGY_PROCESSES=1` turns the
split off (a cap: N processes at most).
"""

from __future__ import annotations

import gc
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from checkpoint_strategy.checkpoints.archive import usable_cores

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
#: at most this many chunks: their numbers fill at most 4 kB of the queue's pipe, the least a pipe holds (one page)
MAX_CHUNKS = 1024
#: items a chunk has at least (fewer: the queue's reads cost more than they balance; tests set 1 for many chunks)
MIN_CHUNK = 4
_INDEX = struct.Struct("<I")


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


def map_split(items: Sequence[T], work: Callable[[Sequence[T], bool], list[R]], encode: Callable[[list[R]], bytes],
              decode: Callable[[bytes], list[R]], progress: Callable[[int], None] | None = None) -> list[R]:
    """`work(items, True)`, the items split over `workers_for(len(items))` processes in chunks taken from a queue.
    `work(chunk, here)`: the results of one chunk (`here`: False in a child, which must not touch the terminal,
    e.g. a progress bar, and here for a chunk `progress` already counted); `encode` turns a chunk's results into
    bytes in a child, `decode` back in this process (ValueError, TypeError or KeyError: bytes it does not take;
    that child's chunks are checked here). `progress(k)`: called here as k more items come back from a child
    (what `work` counts itself when `here`), each item once."""
    n = workers_for(len(items))
    if n == 1:
        return _probe(items, work, encode, decode, progress)
    return _split(items, n, _chunks(len(items), n), work, encode, decode, progress)


def _probe(items: Sequence[T], work: Callable[[Sequence[T], bool], list[R]], encode: Callable[[list[R]], bytes],
           decode: Callable[[bytes], list[R]], progress: Callable[[int], None] | None) -> list[R]:
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
        done += work(items[k:k + 1], True)
        pace = min(pace, clock() - start)
    n = min(_allowed(), rest) if pace * rest >= SLOW_REST else 1
    if n == 1:
        return done + work(items[PROBE:], True)
    return done + _split(items[PROBE:], n, [(a, a + 1) for a in range(rest)], work, encode, decode, progress)


def _split(items: Sequence[T], n: int, chunks: list[tuple[int, int]], work: Callable[[Sequence[T], bool], list[R]],
           encode: Callable[[list[R]], bytes], decode: Callable[[bytes], list[R]],
           progress: Callable[[int], None] | None) -> list[R]:
    """`work` over `chunks` of `items` by this process and up to n - 1 children, taken from one queue."""
    done: dict[int, list[R]] = {}
    children: list[_Child] = []
    queue = _queue(len(chunks))
    try:
        if queue is not None:
            _start(children, min(n, len(chunks)) - 1, items, chunks, queue, work, encode)
            for child in children:
                child.progress = progress
            for i in _take(queue):
                done[i] = work(items[chunks[i][0]:chunks[i][1]], True)
                for child in children:
                    _pump(child, chunks, decode)
        for child in children:
            _finish(child, chunks, done, decode)
        counted = {i for child in children for i in child.counted}
        for i, (a, b) in enumerate(chunks):   # what no trusted process delivered (or no queue): here
            if i not in done:
                done[i] = work(items[a:b], i not in counted)
        return [r for i in range(len(chunks)) for r in done[i]]
    finally:
        if queue is not None:
            os.close(queue)
        for child in children:   # an interrupt or an error here: stop the rest (the collected ones are done)
            _stop(child)


def _start(children: list[_Child], count: int, items: Sequence[T], chunks: list[tuple[int, int]], queue: int,
           work: Callable[[Sequence[T], bool], list[R]], encode: Callable[[list[R]], bytes]) -> None:
    """Fork up to `count` children onto `children` (fewer when a fork fails: this process takes their share)."""
    gc.freeze()   # the objects this process has now are left alone by the children's collections (no copy)
    try:
        for _ in range(count):
            child = _fork(items, chunks, queue, work, encode)
            if child is None:
                break
            children.append(child)
    finally:
        gc.unfreeze()


def _chunks(count: int, workers: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk: 8 or more a process (uneven cores even out), MIN_CHUNK to 32 items each (a chunk
    costs one 4-byte read), at most MAX_CHUNKS of them."""
    size = max(MIN_CHUNK, min(32, count // (workers * 8)), -(-count // MAX_CHUNKS))
    return [(a, min(count, a + size)) for a in range(0, count, size)]


def _queue(count: int) -> int | None:
    """The read end of a pipe holding the numbers 0..count-1 (4 bytes each, little-endian), its write end closed:
    a reader gets b"" once every number is taken. None: no pipe (out of descriptors); this process does it all."""
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        os.set_blocking(w, False)   # (count <= MAX_CHUNKS: the pipe holds it all; a pipe that does not fails here)
        data = memoryview(b"".join(_INDEX.pack(i) for i in range(count)))
        while data:
            data = data[os.write(w, data):]
    except OSError:
        os.close(r)
        return None
    finally:
        os.close(w)
    return r


def _take(queue: int) -> Iterator[int]:
    """The chunk numbers this process takes from the queue, one read each, until it is empty."""
    while True:
        got = os.read(queue, 4)
        if len(got) != 4:   # b"": empty (a short read cannot happen: every write and read is 4 bytes)
            return
        yield _INDEX.unpack(got)[0]


@dataclass
class _Child:
    """One forked process: `pid` 0 once reaped, `fd` the read end of its pipe (non-blocking), -1 once closed;
    `buf` what it sent that is not a whole frame yet, `got` its chunks decoded so far, `trusted` False once
    anything it sent or did is wrong (then none of its chunks is used)."""

    pid: int
    fd: int
    buf: bytearray = field(default_factory=bytearray)
    got: dict[int, list] = field(default_factory=dict)
    trusted: bool = True
    progress: Callable[[int], None] | None = None   # told of each chunk decoded whole
    counted: set[int] = field(default_factory=set)   # the chunks it was told of


def _fork(items: Sequence[T], chunks: list[tuple[int, int]], queue: int,
          work: Callable[[Sequence[T], bool], list[R]], encode: Callable[[list[R]], bytes]) -> _Child | None:
    """A child taking chunks from the queue; None when there is no pipe or process for one."""
    try:
        r, w = os.pipe()
    except OSError:   # out of descriptors
        return None
    try:
        import fcntl   # a bigger pipe (Linux: up to 1 MB unprivileged) lets a child run ahead of the reads

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass
    try:
        pid = os.fork()
    except OSError:   # out of processes or memory
        os.close(r)
        os.close(w)
        return None
    if pid == 0:   # the child: a frame per chunk, then out without running this process's exit handlers
        code = 1
        try:
            os.close(r)
            for i in _take(queue):
                payload = encode(work(items[chunks[i][0]:chunks[i][1]], False))
                data = memoryview(b"%d %d\n%s" % (i, len(payload), payload))
                while data:
                    data = data[os.write(w, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.set_blocking(r, False)
    return _Child(pid, r)


def _pump(child: _Child, chunks: list[tuple[int, int]], decode: Callable[[bytes], list[R]]) -> bool:
    """Read what the child has sent so far (to the end of its output once `_finish` made its pipe blocking) and
    decode its whole frames. True at the end of its output."""
    end = False
    try:
        while True:
            part = os.read(child.fd, 1 << 20)
            if not part:
                end = True
                break
            child.buf += part
    except BlockingIOError:
        pass
    while child.trusted:   # each frame: b"<chunk> <bytes>\n" and that many bytes of payload
        nl = child.buf.find(b"\n", 0, 64)
        if nl < 0:
            child.trusted = len(child.buf) < 64   # (a header is short: no newline in 64 bytes is not one)
            break
        try:
            i, size = (int(x) for x in bytes(child.buf[:nl]).split(b" "))
        except ValueError:
            child.trusted = False
            break
        if not 0 <= i < len(chunks) or i in child.got or size < 0:
            child.trusted = False
            break
        if len(child.buf) < nl + 1 + size:
            break
        payload = bytes(child.buf[nl + 1:nl + 1 + size])
        del child.buf[:nl + 1 + size]
        try:
            results = decode(payload)
        except (ValueError, TypeError, KeyError):
            child.trusted = False
            break
        child.trusted = len(results) == chunks[i][1] - chunks[i][0]
        child.got[i] = results
        if child.trusted and child.progress is not None:
            child.counted.add(i)
            child.progress(len(results))
    return end


def _finish(child: _Child, chunks: list[tuple[int, int]], done: dict[int, list[R]],
            decode: Callable[[bytes], list[R]]) -> None:
    """Read the child's output to its end, reap it, decode the rest; its chunks go into `done` when it exited
    cleanly, sent whole frames only, each chunk once with as many results as it has items, and none that is in
    `done` already (each number is taken from the queue once: a chunk done twice is a child gone wrong)."""
    try:
        if child.trusted:
            os.set_blocking(child.fd, True)   # (now each read waits for the child, up to its end)
            _pump(child, chunks, decode)
    finally:
        os.close(child.fd)
        child.fd = -1
    if not child.trusted:   # nothing of it is used: no waiting for the rest of its work
        os.kill(child.pid, signal.SIGKILL)
    _pid, status = os.waitpid(child.pid, 0)
    child.pid = 0
    child.trusted = (child.trusted and os.waitstatus_to_exitcode(status) == 0 and not child.buf
                     and not done.keys() & child.got.keys())
    if child.trusted:
        done.update(child.got)


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
