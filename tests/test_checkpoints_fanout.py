"""checkpoints/fanout.py: the quick level of validate and prune split over forked processes gives what one
process gives, a child that fails is not trusted (its part is checked again here), and it only forks where
that is safe (one thread running, enough checkpoints, two usable cores)."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from checkpoint_strategy.checkpoints import fanout, prune_survey, validate
from test_checkpoints_walkspeed import _damaged_run

torch = pytest.importorskip("torch", reason="real torch.save archives in the checkpoints")


def _children_left() -> bool:
    """Any child process not reaped (running or exited)."""
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
    return (s.sizes, s.best, s.emergency, [repr(c) for c in s.candidates], s.notes,
            {k: (r.model_dump(mode="json"), validate.seen_data(r)) for k, r in s.results.items()})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _damaged_run(tmp_path_factory.mktemp("fanout") / "run")


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
    assert len(forked) == 2 * (len(range(0, n, -(-n // workers))) - 1)   # validate, then prune's survey
    assert not _children_left()
    statuses = [c["status"] for c in alone[0]["checkpoints"]]
    assert statuses.count("valid") == 2 and "invalid" in statuses   # the damaged run: real findings to carry


@pytest.mark.parametrize("failure", ["raises", "killed", "garbled", "miscounted", "short", "no fork", "no pipe"])
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
        if os.getpid() != parent and failure == "garbled":      # each result line one that is not a result
            lines = data.split(b"\n")
            return b"\n".join([lines[0], *[b'{"path": 1}'] * (len(lines) - 1)])
        if os.getpid() != parent and failure == "miscounted":   # a result line missing
            return data.rsplit(b"\n", 1)[0]
        return data
    monkeypatch.setattr(validate, "check_with_values", check)
    monkeypatch.setattr(validate, "encode_results", encode)
    if failure in ("no fork", "no pipe"):   # the second part cannot get a process: checked here
        calls = []
        real = getattr(os, "fork" if failure == "no fork" else "pipe")

        def second_fails():
            calls.append(1)
            if len(calls) == 2:
                raise OSError(11, "Resource temporarily unavailable")
            return real()
        monkeypatch.setattr(os, "fork" if failure == "no fork" else "pipe", second_fails)
    if failure == "short":
        real_work_split = fanout.map_split

        def short(items, work, enc, dec):
            return real_work_split(items, lambda part, here: work(part, here)[:len(part) if here else 1], enc, dec)
        monkeypatch.setattr(validate, "map_split", short)
    assert _report(run) == alone
    assert not _children_left()


def test_an_interrupt_here_stops_and_reaps_the_children(run, monkeypatch):
    monkeypatch.setattr(fanout, "workers_for", lambda n: 3)
    parent = os.getpid()
    real_check = validate.check_with_values

    def check(*a, **k):
        if os.getpid() == parent:
            raise KeyboardInterrupt
        return real_check(*a, **k)
    monkeypatch.setattr(validate, "check_with_values", check)
    with pytest.raises(KeyboardInterrupt):
        validate.validate_paths([str(run)], level="quick", progress=False)
    assert not _children_left()


def test_it_forks_only_where_safe_and_worth_it(monkeypatch):
    real_count = threading.active_count
    monkeypatch.setattr(threading, "active_count", lambda: 1)   # the test session may run threads of its own
    monkeypatch.setattr(fanout, "usable_cores", lambda: 4)
    assert fanout.workers_for(10_000) == 4
    assert fanout.workers_for(fanout.MIN_ITEMS - 1) == 1
    assert fanout.workers_for(fanout.MIN_ITEMS) == 2            # parts of at least MIN_ITEMS / 2
    monkeypatch.setattr(fanout, "usable_cores", lambda: 64)
    assert fanout.workers_for(10_000) == fanout.MAX_WORKERS
    for value, expected in (("1", 1), ("3", 3), ("0", 1), ("99", fanout.MAX_WORKERS), ("x", fanout.MAX_WORKERS)):
        monkeypatch.setenv("CHECKPOINT_STRATEGY_PROCESSES", value)
        assert fanout.workers_for(10_000) == expected, value
    monkeypatch.delenv("CHECKPOINT_STRATEGY_PROCESSES")
    from checkpoint_strategy.callbacks._worker import ONE_THREAD
    with monkeypatch.context() as m:   # the callbacks' worker process: next to training, no split
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
        assert fanout.workers_for(10_000) == 1                  # another thread: no fork
    finally:
        stop.set()
        other.join()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(fanout, "ENABLED", False)
    assert fanout.workers_for(10_000) == 1
    monkeypatch.delattr(os, "fork")
    monkeypatch.setattr(fanout, "ENABLED", True)
    assert fanout.workers_for(10_000) == 1


@pytest.mark.slow   # four commands on 260 checkpoints: in the full run (CI), not the quick loop
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
        proc = subprocess.run([*CLI, *argv, "--format", "json"], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode in (0, 1), proc.stderr
        data = json.loads(proc.stdout)
        if "summary" in data:
            data["summary"]["seconds"] = 0
        return data
    for argv in (("validate", str(big)), ("prune", str(big), "--keep-last", "3", "--no-spike-check")):
        split, alone = out("8", *argv), out("1", *argv)
        assert split == alone, argv[0]
        if argv[0] == "validate":
            statuses = [c["status"] for c in alone["checkpoints"]]
            assert len(statuses) == fanout.MIN_ITEMS + 4 and 0 < statuses.count("invalid") < 10, statuses
    # --apply on two copies: the same report and the same folders left (deletions follow the same survey)
    other = tmp_path / "other"
    shutil.copytree(big, other, symlinks=True)
    applied = {}
    for value, root in (("8", big), ("1", other)):
        data = out(value, "prune", str(root), "--keep-last", "3", "--no-spike-check", "--apply")
        applied[value] = (json.dumps(data).replace(str(root), "ROOT"), sorted(p.name for p in root.iterdir()))
    assert applied["8"] == applied["1"]
    assert 3 <= len(applied["1"][1]) < fanout.MIN_ITEMS   # it did delete, and kept the window
