"""The plain-PyTorch-loop guard (callbacks/guard.py) on real CPU training: a poisoned batch is rolled back."""

from __future__ import annotations

import json
import logging
import math
import os

import pytest

from checkpoint_strategy.callbacks.guard import TrainingGuard
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.runlog import METRICS_FILE

torch = pytest.importorskip("torch")

LR = 3e-3
POISON = 300
MAX_STEPS = 700


def _batch(step: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 8, generator=g)
    y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1).tanh() + 0.3 * torch.randn(32, 1, generator=g)
    return x, y * scale


def _eval_loss(model) -> float:
    x, y = _batch(10**6)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def _train_step(model, opt, step, guard, poison, label_spike):
    x, y = _batch(step, 30.0 if step == label_spike else 1.0)
    if step == poison:  # a bad shard: its forward pass damages the weights
        with torch.no_grad():
            model[0].weight.mul_(-50)
            model[0].bias.mul_(-50)
    for pg in opt.param_groups:
        pg["lr"] = LR * (guard.lr_scale(step) if guard else 1.0)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    clip = guard.grad_clip(step) if guard else None
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), clip or 1e9)
    opt.step()
    return float(loss.detach()), float(gn)


def _run(
    root=None, guard=None, poison=None, label_spike=None, max_steps=MAX_STEPS, drop_optimizer=False
):
    """A nanoGPT-style loop: the loop saves and loads, the guard decides. Returns (final eval loss, trained steps).
    drop_optimizer: the loop's load forgets the optimizer state (a fresh Adam), as a broken resume does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    step, trained = 0, []
    while step < max_steps:
        step += 1
        if guard is not None and guard.skip(step):
            continue
        loss, gn = _train_step(model, opt, step, guard, poison, label_spike)
        trained.append(step)
        if guard is None:
            continue
        d = guard.step(step, loss, grad_norm=gn)
        if d.action == "save":
            path = os.path.join(root, f"checkpoint-{step}.pt")
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path
            )
            guard.saved(step, path)
        elif d.action == "rollback":
            ck = torch.load(d.checkpoint)  # the loop's own load (tests may torch.load)
            model.load_state_dict(ck["model"])
            if drop_optimizer:
                opt = torch.optim.Adam(model.parameters(), lr=LR)
            else:
                opt.load_state_dict(ck["optimizer"])
            step = d.resume_step
            if guard.resumed(opt).action == "stop":
                break
        elif d.action == "stop":
            break
    return _eval_loss(model), trained


def test_a_poisoned_batch_is_rolled_back_and_the_run_ends_healthy(tmp_path, caplog):
    clean, _ = _run()
    diverged, _ = _run(poison=POISON)
    assert diverged > 2 * clean  # without the guard the run ends diverged
    guard = TrainingGuard(tmp_path, frequency_steps=50)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        final, trained = _run(tmp_path, guard, poison=POISON)
    out = guard.close()
    assert trained[-1] == MAX_STEPS and guard.stopped is None  # finished max_steps on its own
    assert 1 <= len(out["rollbacks"]) <= 2
    rb = out["rollbacks"][0]
    assert rb["resume_step"] < rb["onset"] <= POISON and rb["checkpoint"].endswith(
        f"checkpoint-{rb['resume_step']}.pt"
    )
    assert (
        rb["reason"] == "divergence" and rb["step"] - rb["onset"] >= 100
    )  # waited the detector's window
    assert POISON in out["skipped_steps"] and POISON not in trained[trained.index(rb["step"]) + 1 :]
    assert rb["skip"] == [rb["resume_step"] + 1, rb["onset"] + 20]
    assert (rb["lr_scale"], rb["grad_clip"], rb["lr_until"]) == (0.5, 0.5, rb["resume_step"] + 500)
    assert abs(final - clean) <= 0.15 * clean
    lines = [r.getMessage() for r in caplog.records if "rollback 1/3" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("checkpoint-strategy: divergence at step")
    assert "skipping steps" in lines[0]
    recs = [json.loads(x) for x in (tmp_path / METRICS_FILE).read_text().splitlines()]
    events = [r for r in recs if "event" in r]
    assert [e["event"] for e in events] == [
        "checkpoint-strategy:spike",
        "checkpoint-strategy:rollback",
    ] + ["checkpoint-strategy:resume_check"] * 2
    assert events[1]["checkpoint"] == rb["checkpoint"] and events[1]["skip"] == rb["skip"]
    # the live resume check: the optimizer counter continued from the checkpoint's, the loss came back in the band
    assert (events[2]["verdict"], events[2]["counter"], events[2]["expected"]) == (
        "ok",
        rb["resume_step"],
        rb["resume_step"],
    )
    assert events[3]["verdict"] == "ok" and events[3]["at_step"] == rb["skip"][1] + 5


def test_a_resume_that_drops_the_optimizer_state_stops_with_one_error(tmp_path, caplog):
    guard = TrainingGuard(tmp_path, frequency_steps=50)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        _, trained = _run(tmp_path, guard, poison=POISON, drop_optimizer=True)
    out = guard.close()
    rb = out["rollbacks"][0]
    assert (
        trained[-1] == rb["step"] and "did not restore the optimizer" in out["stopped"]
    )  # no training on
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(
        "checkpoint-strategy: the resume from checkpoint-"
    )
    assert (
        f"step counter is 0, the checkpoint's {rb['resume_step']}" in errors[0]
        and "fresh optimizer" in errors[0]
    )
    check = [a for a in out["actions"] if a["event"] == "checkpoint-strategy:resume_check"]
    assert [(c["verdict"], c["counter"], c["expected"]) for c in check] == [
        ("reset", 0, rb["resume_step"])
    ]


def test_recover_shows_the_rollbacks_done_and_judges_the_curve_after_the_last(tmp_path):
    """recover on a rolled-back run's loss log: the rollbacks the guard did are read from its records and shown,
    and the spike of the abandoned pass is not joined to the losses after the skipped batches (it read as
    self-recovered). The guard restates the checkpoint's loss at the rollback (the restart reads 400->250); a log
    without that line (an older guard's) is judged the same from the records."""
    from checkpoint_strategy.recovery import advise

    guard = TrainingGuard(tmp_path, frequency_steps=50)
    _run(tmp_path, guard, poison=POISON)
    guard.close()
    rb = guard.rollbacks[0]
    log = tmp_path / METRICS_FILE
    older = tmp_path / "older.jsonl"
    older.write_text(
        "".join(
            x + "\n"
            for x in log.read_text().splitlines()
            if x
            != json.dumps(
                {"step": rb["resume_step"], "loss": guard.history[rb["resume_step"] - 1][1]}
            )
        )
    )
    skipped = rb["skip"][1] - rb["skip"][0] + 1
    for path, restart in ((log, rb["resume_step"]), (older, rb["skip"][1] + 1)):
        report = advise(str(path), checkpoints=[])
        assert report.spike is None and report.verdict == "healthy", report.reasons
        assert report.reasons[0].startswith("the run rolled back by itself 1 time(s)")
        assert (
            f"at step {rb['step']} (divergence, onset {POISON}) to checkpoint-{rb['resume_step']}.pt"
            in report.reasons[0]
        )
        assert [(r.previous_step, r.step) for r in report.restarts] == [(rb["step"], restart)]
        assert report.log.points == MAX_STEPS - skipped


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_rollback_records_are_read_across_chunk_edges_and_past_long_lines(
    tmp_path, monkeypatch, chunk
):
    """recover's scan of a real guard log for its rollback records reads the log a chunk at a time (a map of the
    whole log put all of it in recover's resident memory): every record is found whatever the chunk edges cut,
    a line longer than any record (one holding the event name inside a string) is passed over, and the last line
    without its newline is still read."""
    from checkpoint_strategy.recovery import advice, records

    guard = TrainingGuard(tmp_path, frequency_steps=50)
    _run(tmp_path, guard, poison=POISON)
    guard.close()
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    event = advice.ROLLBACK_EVENT.decode()
    long_line = json.dumps({"note": event + "x" * (3 * records.BLOCK_BYTES), "step": 1})
    last = next(x for x in lines if event in x)
    log = tmp_path / "scanned.jsonl"
    # not JSON as a whole line; its tail alone is a record (a scan that carried on past the cut would take it)
    hidden = "#" * (records.BLOCK_BYTES + 1) + last
    log.write_text("\n".join([long_line, *lines, hidden, long_line, hidden]) + "\n" + last)
    want = [json.loads(x) for x in lines if event in x] + [json.loads(last)]
    assert [r["at_step"] for r in want] == [guard.rollbacks[0]["step"]] * 2
    monkeypatch.setattr(records, "BLOCK_BYTES", chunk)
    assert advice.rollback_records(str(log)) == want


def test_a_spike_that_recovers_within_the_window_is_not_rolled_back(tmp_path, caplog):
    guard = TrainingGuard(tmp_path, frequency_steps=50)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        _, trained = _run(tmp_path, guard, label_spike=POISON)
    out = guard.close()
    assert (
        out["rollbacks"] == []
        and out["skipped_steps"] == []
        and trained == list(range(1, MAX_STEPS + 1))
    )
    kinds = [
        a["event"].split(":")[1] for a in out["actions"] if not a["event"].endswith("grad_norm")
    ]
    assert kinds[:2] == ["spike", "recovered"] and kinds == ["spike", "recovered"] * (
        len(kinds) // 2
    )
    assert out["actions"][0]["onset"] == POISON
    # the schedule went on; no save while the spike was open (its step holds spiked weights)
    assert [s.step for s in guard.saves] == [s for s in range(50, MAX_STEPS + 1, 50) if s != POISON]
    assert any("no rollback" in r.getMessage() for r in caplog.records)


def _save(root, step):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    path = os.path.join(root, f"checkpoint-{step}.pt")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
    return path


def _feed(guard, root, steps, spike_at, saves=True):
    """Flat losses, a jump at spike_at that stays; saves where the guard says. The first non-continue decision."""
    for s in steps:
        loss = 1.0 + 0.01 * math.sin(s) + (9.0 if s >= spike_at else 0.0)
        d = guard.step(s, loss)
        if d.action == "save" and saves:
            guard.saved(s, _save(root, s))
        elif d.action not in ("continue", "save"):
            return d
    return None


def test_a_checkpoint_is_never_used_twice_and_the_guard_stops_with_one_error(tmp_path, caplog):
    guard = TrainingGuard(tmp_path, frequency_steps=1000, wait_steps=60)
    guard.saved(40, _save(tmp_path, 40))
    d = _feed(guard, tmp_path, range(1, 300), spike_at=200)
    assert d.action == "rollback" and d.resume_step == 40 and d.step == 260
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        d2 = _feed(
            guard, tmp_path, range(41, 400), spike_at=150
        )  # the same trouble again after the resume
    assert d2.action == "stop" and "no stable checkpoint left" in d2.reason
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert (
        len(errors) == 1
        and errors[0].startswith("checkpoint-strategy: ")
        and "recover" in errors[0]
    )
    assert guard.step(400, 1.0).action == "stop" and len(guard.close()["rollbacks"]) == 1


def test_max_rollbacks_bounds_the_run(tmp_path):
    guard = TrainingGuard(tmp_path, frequency_steps=20, max_rollbacks=0, wait_steps=60)
    d = _feed(guard, tmp_path, range(1, 300), spike_at=200)
    assert d.action == "stop" and "max_rollbacks=0" in d.reason


def test_emergency_post_onset_and_unstable_saves_are_never_targets(tmp_path):
    guard = TrainingGuard(tmp_path, frequency_steps=1000, wait_steps=60)
    guard.saved(40, _save(tmp_path, 40))
    _feed(guard, tmp_path, range(1, 181), spike_at=1000)
    guard.saved(180, _save(tmp_path, 180), kind="emergency")
    (tmp_path / "checkpoint-190.pt").write_bytes(b"torn")
    guard.saved(190, str(tmp_path / "checkpoint-190.pt"))  # does not validate at level full
    d = _feed(guard, tmp_path, range(181, 300), spike_at=200)
    guard.saved(205, _save(tmp_path, 205))  # after the onset: never (the event is decided)
    assert d.action == "rollback" and d.resume_step == 40


def test_playbook_numbers_are_overridable_and_bad_ones_are_one_line():
    g = TrainingGuard(
        None, frequency_steps=10, lr_multiplier=0.25, lr_reduced_steps=100, grad_clip=1.0
    )
    assert (g.options.lr_multiplier, g.options.lr_reduced_steps, g.options.grad_clip) == (
        0.25,
        100,
        1.0,
    )
    with pytest.raises(UsageError, match="lr"):
        TrainingGuard(None, lr_multiplier=2.0)
    with pytest.raises(UsageError, match="max_rollbacks"):
        TrainingGuard(None, max_rollbacks=-1)
    assert (
        TrainingGuard(None, policy={"frequency": "every_25_steps", "keep_last": 2}).frequency == 25
    )


def test_a_preemption_signal_answers_save_then_stop(tmp_path):
    import signal

    from checkpoint_strategy.callbacks.preempt import read_record

    before = signal.getsignal(signal.SIGUSR1)
    guard = TrainingGuard(tmp_path, frequency_steps=1000, preemption_signals=["SIGUSR1"])
    try:
        for s in range(1, 30):
            assert guard.step(s, 1.0).action == "continue"
        os.kill(
            os.getpid(), signal.SIGUSR1
        )  # delivered to the main thread before the next bytecode
        d = guard.step(30, 1.0)
        assert d.action == "save" and d.stop and "SIGUSR1" in d.reason
        guard.saved(30, _save(tmp_path, 30))
        assert guard.step(31, 1.0).action == "stop"
        assert read_record(tmp_path)["step"] == 30 and guard.saves[-1].kind == "preemption"
    finally:
        guard.close()
    assert signal.getsignal(signal.SIGUSR1) == before  # the handler the process had is back


def test_the_guards_actions_and_its_stop_reach_the_handoff_state(tmp_path):
    from checkpoint_strategy.callbacks.core import StrategyCore

    core = StrategyCore(
        {"frequency": "every_20_steps", "keep_last": 2}, handoff_dir=str(tmp_path / "state")
    )
    core.root = str(tmp_path)
    guard = TrainingGuard(tmp_path, frequency_steps=20, max_rollbacks=0, wait_steps=60)
    guard.on_action = core.actions.append  # as train_with_recovery / fit_with_recovery wire it
    d = _feed(guard, tmp_path, range(1, 300), spike_at=200)
    assert d.action == "stop"
    core.write_handoff()
    doc = json.loads((tmp_path / "state" / "checkpoint-strategy.json").read_text())
    assert [a["event"] for a in doc["automatic_actions"]] == [
        "checkpoint-strategy:spike",
        "checkpoint-strategy:stop",
    ]
    assert any(
        r.startswith("training callback stopped the run: divergence at step")
        and "max_rollbacks=0" in r
        for r in doc["pending_risks"]
    )
