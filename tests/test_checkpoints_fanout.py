"""validate/fanout.py: the quick level of validate and prune split over forked processes (a ProcessPoolExecutor
in the fork context) gives what one process gives, a worker that fails is not trusted (its part is checked again
here), and it only forks where that is safe (one thread running, enough checkpoints, two usable cores)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from test_checkpoints_walkspeed import _damaged_run

from checkpoint_strategy.retention import survey as prune_survey
from checkpoint_strategy.validate import engine as validate
from checkpoint_strategy.validate import fanout

torch = pytest.importorskip("torch", reason="real torch.save archives in the checkpoints")


def _children() -> set[int] | None:
    """This process's children, running or exited and not reaped (Linux: /proc/self/task/*/children), or None."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    found: set[int] = set()
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as fh:
                found.update(int(p) for p in fh.read().split())
        except (OSError, ValueError):
            return None
    return found


_BEFORE: set[int] | None = None


@pytest.fixture(autouse=True)
def _children_before():
    """The children this (pytest worker) process had before the test: another test's leftover is not fanout's."""
    global _BEFORE
    _BEFORE = _children()
    yield


def _children_left() -> bool:
    """Any child process the split started and did not reap (running or exited); where /proc cannot tell which
    children are new, any child at all."""
    now = _children()
    if now is not None and _BEFORE is not None:
        return bool(now - _BEFORE)
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def _report(root) -> dict:
    rep = validate.validate_paths([str(root)], level="quick", progress=False)
    seen = [validate.seen_data(r) for r in rep.checkpoints]
    data = rep.model_dump(mode="json")
    data["summary"]["seconds"] = 0
    return json.loads(json.dumps([data, seen]))


def _survey(root) -> tuple:
    s = prune_survey.survey(str(root))
    return (
        s.sizes,
        s.best,
        s.emergency,
        [repr(c) for c in s.candidates],
        s.notes,
        {k: (r.model_dump(mode="json"), validate.seen_data(r)) for k, r in s.results.items()},
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _damaged_run(tmp_path_factory.mktemp("fanout") / "run")


@pytest.fixture(autouse=True)
def _one_item_chunks(monkeypatch):
    """Chunks of one checkpoint: the small runs here make as many chunks as they have checkpoints."""
    monkeypatch.setattr(fanout, "MIN_CHUNK", 1)


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_split_over_processes_gives_what_one_process_gives(run, monkeypatch, workers):
    monkeypatch.setattr(fanout, "ENABLED", False)
    alone, alone_survey = _report(run), _survey(run)
    monkeypatch.setattr(fanout, "ENABLED", True)
    monkeypatch.setattr(fanout, "workers_for", lambda n: workers)
    forked = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forked.append(1) or real_fork())
    assert _report(run) == alone
    assert _survey(run) == alone_survey
    n = len(alone[0]["checkpoints"])
    assert len(fanout._chunks(n, workers)) == n
    assert len(forked) == 2 * (min(workers, n) - 1)  # validate, then prune's survey
    assert not _children_left()
    statuses = [c["status"] for c in alone[0]["checkpoints"]]
    assert (
        statuses.count("valid") == 2 and "invalid" in statuses
    )  # the damaged run: real findings to carry


@pytest.mark.parametrize(
    "failure",
    ["raises", "killed", "garbled", "miscounted", "short", "no fork", "no pipe", "no queue"],
)
def test_a_child_that_fails_is_checked_again_here(run, monkeypatch, failure):
    monkeypatch.setattr(fanout, "ENABLED", False)
    alone = _report(run)
    monkeypatch.setattr(fanout, "ENABLED", True)
    monkeypatch.setattr(fanout, "workers_for", lambda n: 3)
    parent = os.getpid()
    real_check, real_encode = validate.check_with_values, validate.encode_results

    def check(*a, **k):
        if os.getpid() != parent and failure == "raises":
            raise RuntimeError("a child's failure")
        if os.getpid() != parent and failure == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        return real_check(*a, **k)

    def encode(results):
        data = real_encode(results)
        if (
            os.getpid() != parent and failure == "garbled"
        ):  # each result line one that is not a result
            lines = data.split(b"\n")
            return b"\n".join([lines[0], *[b'{"path": 1}'] * (len(lines) - 1)])
        if os.getpid() != parent and failure == "miscounted":  # a result line missing
            return data.rsplit(b"\n", 1)[0]
        return data

    monkeypatch.setattr(validate, "check_with_values", check)
    monkeypatch.setattr(validate, "encode_results", encode)
    if failure in (
        "no fork",
        "no pipe",
        "no queue",
    ):  # a child (or the queue, the first pipe) cannot be had
        calls = []
        real = getattr(os, "fork" if failure == "no fork" else "pipe")

        def second_fails():
            calls.append(1)
            if len(calls) == (1 if failure == "no queue" else 2):
                raise OSError(11, "Resource temporarily unavailable")
            return real()

        monkeypatch.setattr(os, "fork" if failure == "no fork" else "pipe", second_fails)
    if failure == "short":
        real_work_split = fanout.map_split

        def short(items, work, enc, dec, progress=None):
            return real_work_split(
                items,
                lambda part, here: work(part, here)[: len(part) - (not here)],
                enc,
                dec,
                progress,
            )

        monkeypatch.setattr(validate, "map_split", short)
    assert _report(run) == alone
    assert not _children_left()


def test_held_up_workers_leave_the_rest_to_this_process(run, monkeypatch, tmp_path):
    """The chunks go to whichever process is free: with the workers held up (a core shared with another job),
    this process checks every chunk not yet handed to one itself, and the report is the same. Held up, not
    slowed: each worker waits until this process has checked a chunk, so the outcome does not depend on the
    machine's load."""
    monkeypatch.setattr(fanout, "ENABLED", False)
    alone = _report(run)
    n = len(alone[0]["checkpoints"])
    monkeypatch.setattr(fanout, "ENABLED", True)
    monkeypatch.setattr(fanout, "workers_for", lambda n: 3)
    parent = os.getpid()
    here = []
    real_check = validate.check_with_values
    took, released = tmp_path / "took", tmp_path / "released"
    took.mkdir()

    def check(*a, **k):
        if os.getpid() == parent:
            here.append(1)
            released.touch()
            if (
                len(here) == 1
            ):  # (the workers may start after this process has claimed every chunk: wait for one)
                _until(lambda: any(took.iterdir()), "a worker to take a chunk")
        else:
            (took / f"{os.getpid()}-{time.monotonic_ns()}").touch()
            _until(released.exists, "this process to check a chunk")
        return real_check(*a, **k)

    monkeypatch.setattr(validate, "check_with_values", check)
    assert _report(run) == alone
    assert (
        1 <= len(here) < n and len(here) + len(os.listdir(took)) == n
    )  # each checkpoint checked once
    assert not _children_left()


def test_results_with_any_path_cross_the_pipe():
    """A path with a newline, a '|', spaces, or a byte that is not UTF-8 (a lone surrogate, as os.listdir reads
    it): each result comes back as it went, what the checker saw included."""
    from checkpoint_strategy.formats.models import CheckpointResult, Seen

    results = []
    for path in ("/r/a\nb", "/r/x | y z", "/r/caf\u00e9", "/r/bad\udcff", ""):
        r = CheckpointResult(
            path=path,
            format="hf-trainer",
            status="valid",
            resumable=True,
            sharded=False,
            portability="p",
            level="quick",
            notes=[path],
        )
        r._seen = Seen(("zip",), (path + "\n",), 3, (path + "|",), None, path, True)
        results.append(r)
    back = validate.decode_results(validate.encode_results(results))
    assert [b.model_dump() for b in back] == [r.model_dump() for r in results]
    assert [b.seen for b in back] == [r.seen for r in results]


def test_a_run_under_a_folder_name_that_is_not_utf8_splits_as_usual(run, tmp_path, monkeypatch):
    """A run folder whose name holds a byte that is not UTF-8: the children's results still cross the pipe
    (no child untrusted, nothing checked twice) and the report is the one a single process gives."""
    import shutil

    root = os.path.join(os.fsencode(tmp_path), b"r\xffun")
    try:
        os.mkdir(root)
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system takes no such name")
    for step in range(
        10, 70, 10
    ):  # the sound checkpoint six times (the damaged ones hold FIFOs: no copy)
        shutil.copytree(
            run / "checkpoint-10",
            os.fsdecode(os.path.join(root, b"checkpoint-%d" % step)),
            symlinks=True,
        )
    os.remove(
        os.path.join(root, b"checkpoint-30", b"trainer_state.json")
    )  # and one finding to carry
    here = os.fsdecode(root)
    monkeypatch.setattr(fanout, "ENABLED", False)
    alone = _report(here)
    monkeypatch.setattr(fanout, "ENABLED", True)
    monkeypatch.setattr(fanout, "workers_for", lambda n: 3)
    decoded = []
    real_decoded = fanout._decoded

    def decoded_here(*a):
        got = real_decoded(*a)
        decoded.append(got is not None)
        return got

    monkeypatch.setattr(fanout, "_decoded", decoded_here)
    assert _report(here) == alone
    assert all(
        decoded
    )  # every chunk a worker sent was taken (this process may have taken them all first)
    assert "\udcff" in alone[0]["checkpoints"][0]["path"]
    assert [c["status"] for c in alone[0]["checkpoints"]].count("valid") == 5


@pytest.mark.parametrize(
    ("payload", "taken"),
    [
        (b"[3, 4]", True),
        (None, False),  # the worker's work raised
        (b"[3]", False),  # fewer results than the chunk has items
        (b"[3, 4, 5]", False),  # more
        (b"[3, 4", False),  # bytes that do not decode
        (b'{"a": 1}', False),  # not a list
        (b"", False),
    ],
)
def test_a_chunk_is_taken_only_when_it_decodes_to_one_result_an_item(payload, taken):
    assert (fanout._decoded(payload, json.loads, 2) is not None) == taken


def test_a_worker_that_sent_anything_wrong_is_not_trusted_with_any_chunk():
    """A worker's good chunks are dropped once any chunk of it is wrong (redone here); another worker's stay; a
    future that raised (a worker killed: BrokenProcessPool) is just left to be redone."""
    from concurrent.futures import Future

    def future(result=None, exc=None):
        f = Future()
        f.set_running_or_notify_cancel()
        if exc:
            f.set_exception(exc)
        else:
            f.set_result(result)
        return f

    told = []
    g = fanout._Gathered([2, 1, 1, 1], json.loads, told.append)
    g.take(0, future((11, "done", b"[1, 2]")))
    g.take(1, future((22, "done", b"[3]")))
    g.take(2, future((11, "done", b"[4, 5]")))  # worker 11 goes wrong
    g.take(3, future(exc=RuntimeError("killed")))
    g.take(3, future((33, "skipped", None)))  # this process took it first
    assert g.trusted() == {1: [3]} and not g.untrusted - {11}
    assert g.counted == {0, 1} and told == [
        2,
        1,
    ]  # what was counted is not counted again when redone


def test_an_interrupt_here_stops_and_reaps_the_children(run, monkeypatch, tmp_path):
    monkeypatch.setattr(fanout, "workers_for", lambda n: 3)
    parent = os.getpid()
    real_check = validate.check_with_values
    interrupted = tmp_path / "interrupted"

    def check(*a, **k):
        if os.getpid() == parent:
            interrupted.touch()
            raise KeyboardInterrupt
        # the children wait: this process gets a chunk whatever the order they start in
        _until(interrupted.exists, "this process to take a chunk")
        return real_check(*a, **k)

    monkeypatch.setattr(validate, "check_with_values", check)
    with pytest.raises(KeyboardInterrupt):
        validate.validate_paths([str(run)], level="quick", progress=False)
    assert not _children_left()


def test_it_forks_only_where_safe_and_worth_it(monkeypatch):
    real_count = threading.active_count
    monkeypatch.setattr(
        threading, "active_count", lambda: 1
    )  # the test session may run threads of its own
    monkeypatch.setattr(fanout, "usable_cores", lambda: 4)
    assert fanout.workers_for(10_000) == 4
    assert fanout.workers_for(fanout.MIN_ITEMS - 1) == 1
    assert fanout.workers_for(fanout.MIN_ITEMS) == 2  # parts of at least MIN_ITEMS / 2
    monkeypatch.setattr(fanout, "usable_cores", lambda: 64)
    assert fanout.workers_for(10_000) == fanout.MAX_WORKERS
    for value, expected in (
        ("1", 1),
        ("3", 3),
        ("0", 1),
        ("99", fanout.MAX_WORKERS),
        ("x", fanout.MAX_WORKERS),
    ):
        monkeypatch.setenv("CHECKPOINT_STRATEGY_PROCESSES", value)
        assert fanout.workers_for(10_000) == expected, value
    monkeypatch.delenv("CHECKPOINT_STRATEGY_PROCESSES")
    from checkpoint_strategy.callbacks._worker import ONE_THREAD

    with monkeypatch.context() as m:  # the callbacks' worker process: next to training, no split
        for key, value in ONE_THREAD.items():
            m.setenv(key, value)
        assert fanout.workers_for(10_000) == 1
    monkeypatch.setattr(fanout, "usable_cores", lambda: 1)
    assert fanout.workers_for(10_000) == 1
    monkeypatch.setattr(fanout, "usable_cores", lambda: 4)
    monkeypatch.setattr(threading, "active_count", real_count)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert fanout.workers_for(10_000) == 1  # another thread: no fork
    finally:
        stop.set()
        other.join()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(fanout, "ENABLED", False)
    assert fanout.workers_for(10_000) == 1
    monkeypatch.delattr(os, "fork")
    monkeypatch.setattr(fanout, "ENABLED", True)
    assert fanout.workers_for(10_000) == 1


@pytest.mark.slow  # four commands on 260 checkpoints: in the full run (CI), not the quick loop
def test_the_commands_split_a_big_folder_and_report_the_same(run, tmp_path):
    """End to end, as a user runs them: `validate` and a `prune` dry run on a folder of MIN_ITEMS + 4 checkpoints
    (a few damaged) print the same JSON with the split (the default on a 2-core machine) and without it
    (CHECKPOINT_STRATEGY_PROCESSES=1)."""
    import shutil
    import subprocess

    from cliresult import CLI, checkout_env

    big = tmp_path / "big"
    damaged = sorted(p for p in run.iterdir() if p.name != "checkpoint-10")
    for i in range(fanout.MIN_ITEMS + 4):
        src = damaged[i % len(damaged)] if i % 50 == 7 else run / "checkpoint-10"
        shutil.copytree(src, big / f"checkpoint-{(i + 1) * 10}", symlinks=True)

    def out(env_value, *argv):
        env = checkout_env(CHECKPOINT_STRATEGY_PROCESSES=env_value)
        proc = subprocess.run(
            [*CLI, *argv, "--format", "json"], capture_output=True, text=True, env=env, timeout=300
        )
        assert proc.returncode in (0, 1), proc.stderr
        data = json.loads(proc.stdout)
        if "summary" in data:
            data["summary"]["seconds"] = 0
        return data

    for argv in (
        ("validate", str(big)),
        ("prune", str(big), "--keep-last", "3", "--no-spike-check"),
    ):
        split, alone = out("8", *argv), out("1", *argv)
        assert split == alone, argv[0]
        if argv[0] == "validate":
            statuses = [c["status"] for c in alone["checkpoints"]]
            assert len(statuses) == fanout.MIN_ITEMS + 4 and 0 < statuses.count("invalid") < 10, (
                statuses
            )
    # --apply on two copies: the same report and the same folders left (deletions follow the same survey)
    other = tmp_path / "other"
    shutil.copytree(big, other, symlinks=True)
    applied = {}
    for value, root in (("8", big), ("1", other)):
        data = out(value, "prune", str(root), "--keep-last", "3", "--no-spike-check", "--apply")
        applied[value] = (
            json.dumps(data).replace(str(root), "ROOT"),
            sorted(p.name for p in root.iterdir()),
        )
    assert applied["8"] == applied["1"]
    assert 3 <= len(applied["1"][1]) < fanout.MIN_ITEMS  # it did delete, and kept the window


def _until(done, what: str) -> None:
    """Wait for another process (a child, or this one) to get somewhere: a handshake, never a measure of speed.
    The bound only turns a broken split into a failure instead of a hang."""
    deadline = time.monotonic() + 120
    while not done():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.002)


def _pid_work(cost, parent: int, child_done: tuple[int, int], forked: list):
    """A work function: item x costs `cost(x)` seconds on fanout's (fake) clock; its result says which process
    checked it. Once a child was forked, this process waits, past the probe, until a child has checked an item
    (a byte on the `child_done` pipe): a split's child then takes part however loaded the machine is."""
    import select

    def work(part, _here):
        out = []
        for x in part:
            fanout.clock.now += cost(x)
            if os.getpid() == parent and forked and x >= fanout.PROBE:
                _until(
                    lambda: select.select([child_done[0]], [], [], 0)[0], "a child to check an item"
                )
            out.append((x, os.getpid()))
            if os.getpid() != parent:
                os.write(child_done[1], b"x")
        return out

    return work


class _FakeClock:
    """fanout's clock: it moves only as much as the work says its items cost."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _pids(items, cost, monkeypatch, cores=2):
    """Which process checked each item; `cost`: seconds an item (a number, or a function of the item)."""
    monkeypatch.setattr(
        threading, "active_count", lambda: 1
    )  # the test session may run threads of its own
    monkeypatch.setattr(fanout, "usable_cores", lambda: cores)
    monkeypatch.setattr(fanout, "clock", _FakeClock())
    forked: list[int] = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forked.append(1) or real_fork())
    pipe = os.pipe()
    try:
        work = _pid_work(cost if callable(cost) else lambda x: cost, os.getpid(), pipe, forked)
        got = fanout.map_split(
            items,
            work,
            lambda r: json.dumps(r).encode(),
            lambda b: [tuple(x) for x in json.loads(b)],
        )
    finally:
        os.close(pipe[0])
        os.close(pipe[1])
    assert [x for x, _pid in got] == list(items)
    assert not _children_left()
    return [pid for _x, pid in got]


def test_fewer_items_split_when_they_are_slow(monkeypatch):
    """Below MIN_ITEMS: a few slow items (a real optimizer.pt is ~20 ms at the quick level) are split after the
    PROBE items were timed here; quick ones, or slow ones that would not reach SLOW_REST, are not. The costs are
    the probe's clock's (injected): the machine's load changes nothing."""
    monkeypatch.setattr(fanout, "SLOW_REST", 0.125)
    here = os.getpid()
    pids = _pids(list(range(10)), 1 / 64, monkeypatch)  # 8 left x 1/64 s = SLOW_REST: split
    assert pids[: fanout.PROBE] == [here] * fanout.PROBE
    assert set(pids) - {here}, "no item was checked by a child"
    assert set(_pids(list(range(9)), 1 / 64, monkeypatch)) == {here}  # 7 x 1/64 s < SLOW_REST: here
    assert set(_pids(list(range(12)), 0.0002, monkeypatch)) == {here}  # 2 ms in all: here
    assert set(_pids(list(range(3)), 1.0, monkeypatch)) == {here}  # 1 left: never split
    # the quicker probe's pace: the first item's one-time cost (a cold cache) does not count
    assert set(_pids(list(range(10)), lambda x: 10.0 if x == 0 else 1 / 128, monkeypatch)) == {here}
    assert set(_pids(list(range(10)), lambda x: 10.0 if x == 1 else 1 / 64, monkeypatch)) - {here}
    assert set(_pids(list(range(12)), 1 / 64, monkeypatch, cores=1)) == {here}
    monkeypatch.setenv("CHECKPOINT_STRATEGY_PROCESSES", "1")
    assert set(_pids(list(range(12)), 1 / 64, monkeypatch)) == {here}
    monkeypatch.delenv("CHECKPOINT_STRATEGY_PROCESSES")
    monkeypatch.setattr(fanout, "ENABLED", False)
    assert set(_pids(list(range(12)), 1 / 64, monkeypatch)) == {here}


def test_slow_few_checkpoints_split_and_report_what_one_process_reports(run, monkeypatch):
    """The run's checkpoints (fewer than MIN_ITEMS) made slow: the probe splits them, and validate and prune's
    survey give what one process gives."""
    monkeypatch.setattr(fanout, "ENABLED", False)
    alone, alone_survey = _report(run), _survey(run)
    monkeypatch.setattr(fanout, "ENABLED", True)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(fanout, "usable_cores", lambda: 2)
    monkeypatch.setattr(fanout, "SLOW_REST", 0.0)  # any pace is slow enough
    forks = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    assert _report(run) == alone
    assert _survey(run) == alone_survey
    assert len(forks) == 2


@pytest.mark.parametrize("child_sends", ["good", "garbled", "good then garbled"])
def test_progress_counts_every_item_once(monkeypatch, child_sends, tmp_path):
    """The bar: items checked here count themselves (`here`), a child's count through `progress` as their chunk
    comes back whole; a chunk counted from a child that later goes wrong is redone here without counting again."""
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(fanout, "workers_for", lambda n: 3)
    here, told = [], []
    sent = [0]
    a_child_sent = tmp_path / "sent"

    def work(part, is_here):
        if (
            is_here
        ):  # (a child sends a chunk before this process checks one: however loaded the machine is)
            _until(a_child_sent.exists, "a child to send a chunk")
            here.extend(part)
        return list(part)

    def encode(results):
        sent[0] += 1  # (in the child: its own count)
        a_child_sent.touch()
        if child_sends == "garbled" or (child_sends == "good then garbled" and sent[0] > 1):
            return b"not json"
        return json.dumps(results).encode()

    got = fanout.map_split(
        list(range(60)), work, encode, lambda b: json.loads(b), progress=told.append
    )
    assert got == list(range(60))
    assert len(here) + sum(told) == 60
    assert sorted(set(here)) == sorted(here)  # nothing counted twice here
    if child_sends == "good":
        assert sum(told) > 0
    if child_sends == "garbled":
        assert told == []
    if (
        child_sends == "good then garbled"
    ):  # the first chunk of each child counted, then redone here uncounted
        assert 0 < sum(told) < 60
    assert not _children_left()


@pytest.mark.skipif(
    not os.path.exists("/proc/self/task"), reason="PR_SET_PDEATHSIG and /proc are Linux's"
)
def test_workers_end_when_the_process_that_forked_them_is_killed(tmp_path):
    """A prune killed mid-survey (SIGKILL) must not leave its workers alive: they inherited its folder lock, and the
    next prune would wait on it forever (found by test_crash_safety_kill_prune_apply_at_random_points under -n 2)."""
    import subprocess
    import sys

    from cliresult import checkout_env

    code = (
        "import os, sys, time\n"
        "from checkpoint_strategy.validate import fanout\n"
        "fanout.workers_for = lambda n: 3\n"
        "def work(part, here):\n"
        "    if here:\n"
        "        while not os.listdir(sys.argv[1]):\n"
        "            time.sleep(0.01)\n"
        "    else:\n"
        "        open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
        "        time.sleep(600)\n"
        "    return list(part)\n"
        "fanout.map_split(list(range(64)), work, lambda r: bytes(r), lambda b: list(b))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=checkout_env())
    try:
        _until(lambda: len(os.listdir(tmp_path)) >= 1, "a worker to start a chunk")
        workers = [int(name) for name in os.listdir(tmp_path)]
    finally:
        proc.kill()
        proc.wait()

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    _until(lambda: not any(alive(pid) for pid in workers), "the workers to end with their parent")
