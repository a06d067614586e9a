"""fit_with_recovery (callbacks/lightning_playbook.py) on a real tiny Lightning fit on CPU with a poisoned batch."""

from __future__ import annotations

import json
import logging
import os
import signal
import textwrap

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

import callbackruns  # noqa: E402
from callbackruns import PB_EPOCH as EPOCH  # noqa: E402
from callbackruns import PB_POISON as POISON  # noqa: E402
from callbackruns import PB_STEPS as STEPS  # noqa: E402
from callbackruns import PL_PREEMPT_FIT, run_signalled, signal_at  # noqa: E402

from checkpoint_strategy.errors import UsageError  # noqa: E402
from checkpoint_strategy.formats.runlog import METRICS_FILE  # noqa: E402


def _fit_parts(out, *, poison=None, label_spike=None, with_strategy=True):
    """The playbook's fit (tests/callbackruns.py, as its 2-process run): trainer, module, loader; one epoch every
    EPOCH batches, so each save (every 50 steps) is at an epoch end and a resume draws the same batches."""
    torch.set_num_threads(1)
    data = callbackruns.pl_data(poison == POISON, label_spike)
    loader = torch.utils.data.DataLoader(
        data, batch_size=callbackruns.PB_BATCH, sampler=callbackruns.pl_sampler()
    )
    trainer = callbackruns.pl_trainer(out, with_strategy=with_strategy, devices=1)
    return trainer, callbackruns.pl_net(), loader


def _eval(model) -> float:
    return callbackruns.pb_eval(model.net)


@pytest.fixture(scope="module")
def lightning_baseline(tmp_path_factory):
    out = []
    for poison in (None, POISON):
        trainer, model, loader = _fit_parts(
            tmp_path_factory.mktemp("plain"), poison=poison, with_strategy=False
        )
        trainer.fit(model, loader)
        out.append(_eval(model))
    return tuple(out)


def test_a_poisoned_batch_is_rolled_back_and_the_fit_finishes(lightning_baseline, tmp_path, caplog):
    from checkpoint_strategy.callbacks import fit_with_recovery, last_valid_checkpoint

    clean, diverged = lightning_baseline
    assert diverged > 2 * clean  # without the playbook the run ends diverged
    trainer, model, loader = _fit_parts(tmp_path, poison=POISON)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        out = fit_with_recovery(trainer, model, train_dataloaders=loader)
    assert out["global_step"] == STEPS and out["stopped"] is None and out["fits"] == 2
    assert 1 <= len(out["rollbacks"]) <= 2
    rb = out["rollbacks"][0]
    assert rb["onset"] == POISON and rb["resume_step"] == 250
    assert rb["checkpoint"] == str(tmp_path / "epoch=4-step=250.ckpt")
    assert rb["skip"] == [251, POISON + 20] and out["skipped_steps"] == list(
        range(251, POISON + 21)
    )
    assert abs(_eval(model) - clean) <= 0.15 * clean
    assert trainer.gradient_clip_val is None  # the user's clipping is back after the call
    assert "training_step" not in model.__dict__
    assert any("rollback 1/3 to epoch=4-step=250.ckpt" in r.getMessage() for r in caplog.records)
    events = [
        json.loads(x) for x in (tmp_path / METRICS_FILE).read_text().splitlines() if '"event"' in x
    ]
    assert [e["event"] for e in events] == [
        "checkpoint-strategy:spike",
        "checkpoint-strategy:rollback",
    ] + ["checkpoint-strategy:resume_check"] * 2
    # the live resume check: the optimizer counter continued from the checkpoint's, the loss came back in the band
    assert [(e["verdict"], e.get("counter")) for e in events[2:]] == [
        ("ok", rb["resume_step"]),
        ("ok", None),
    ]
    # the first pass's saves after the onset hold the spiked weights: never the resume point of a next launch
    assert last_valid_checkpoint(str(tmp_path)) == str(
        tmp_path / f"epoch={STEPS // EPOCH - 1}-step={STEPS}.ckpt"
    )
    marked = sorted(p.name for p in tmp_path.glob("*.checkpoint-strategy.json"))
    assert marked and all("v1" not in m for m in marked)


def test_the_lr_and_clipping_window_apply_in_the_resumed_fit(tmp_path):
    from checkpoint_strategy.callbacks import fit_with_recovery

    seen = []  # (step, LR, clip) at each optimizer step

    class Spy(pl.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            seen.append(
                (
                    trainer.global_step + 1,
                    optimizer.param_groups[0]["lr"],
                    trainer.gradient_clip_val,
                )
            )

    trainer, model, loader = _fit_parts(tmp_path, poison=POISON)
    trainer.callbacks.append(Spy())
    out = fit_with_recovery(trainer, model, train_dataloaders=loader, lr_reduced_steps=100)
    rb = out["rollbacks"][0]
    assert rb["lr_until"] == 350
    resumed = seen[seen.index((rb["step"], 3e-3, None)) + 1 :]
    # a skipped step makes no forward or backward pass, but Lightning still calls the optimizer (no grad: no move)
    assert [s for s, _, _ in resumed] == list(range(251, STEPS + 1))
    assert all((lr, clip) == (1.5e-3, 0.5) for s, lr, clip in resumed if s <= 350)
    assert all((lr, clip) == (3e-3, None) for s, lr, clip in resumed if s > 350)


def test_a_spike_that_recovers_is_not_rolled_back(tmp_path):
    from checkpoint_strategy.callbacks import fit_with_recovery

    trainer, model, loader = _fit_parts(tmp_path, label_spike=POISON)
    out = fit_with_recovery(trainer, model, train_dataloaders=loader)
    assert out["rollbacks"] == [] and out["skipped_steps"] == [] and out["fits"] == 1
    events = [a["event"] for a in out["actions"]]
    assert out["global_step"] == STEPS and out["actions"][0]["onset"] == POISON
    # the label spike and its echo a few steps later (Adam's moments): each one back within the window
    assert events == ["checkpoint-strategy:spike", "checkpoint-strategy:recovered"] * (
        len(events) // 2
    )


def test_a_trainer_without_the_strategy_is_one_line(tmp_path):
    from checkpoint_strategy.callbacks import fit_with_recovery

    trainer, model, loader = _fit_parts(tmp_path, with_strategy=False)
    with pytest.raises(UsageError, match="no LightningCheckpointStrategy"):
        fit_with_recovery(trainer, model, train_dataloaders=loader)


def test_a_resume_that_drops_the_optimizer_state_stops_with_one_error(tmp_path, caplog):
    from checkpoint_strategy.callbacks import fit_with_recovery

    trainer, model, loader = _fit_parts(tmp_path, poison=POISON)
    # a broken resume: the weights come back, the optimizers are the fresh ones configure_optimizers made
    trainer._checkpoint_connector.restore_optimizers_and_schedulers = lambda: None
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        out = fit_with_recovery(trainer, model, train_dataloaders=loader)
    rb = out["rollbacks"][0]
    assert out["fits"] == 2 and "did not restore the optimizer" in out["stopped"]
    assert (
        out["global_step"] == rb["resume_step"] + 1
    )  # stopped at the first batch of the resumed fit
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert (
        len(errors) == 1
        and "step counter is 0, the checkpoint's 250 (a fresh optimizer" in errors[0]
    )


# a preempted playbook fit and its resumed launch, in a subprocess (the signal): tests/callbackruns.py PL_PREEMPT_FIT; `handles` is how many open files of this process are the loss log, at the end of training
PREEMPTED = (
    textwrap.dedent("""
    import os, sys, time, torch
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from checkpoint_strategy.callbacks import LightningCheckpointStrategy, fit_with_recovery, last_valid_checkpoint
    from checkpoint_strategy.formats.runlog import METRICS_FILE

    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)

""")
    + PL_PREEMPT_FIT
    + textwrap.dedent("""

    log = os.path.realpath(os.path.join(out, METRICS_FILE))

    class Spy(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            print(f"step {trainer.global_step}", flush=True)
            time.sleep(0.02)
        def on_train_end(self, trainer, module):
            fds = [os.path.join("/proc/self/fd", f) for f in os.listdir("/proc/self/fd")]
            print("handles", sum(1 for f in fds if os.path.realpath(f) == log), flush=True)

    cb = LightningCheckpointStrategy({"frequency": "every_50_steps", "keep_last": 3}, handoff_dir=None)
    trainer = pl.Trainer(max_steps=steps, callbacks=[cb, ModelCheckpoint(dirpath=out, save_top_k=-1), Spy()],
                         logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         devices=1, log_every_n_steps=1)
    res = fit_with_recovery(trainer, Net(), train_dataloaders=loader, ckpt_path=last_valid_checkpoint(out))
    print("done", res["global_step"], "preempted" if cb.preempted else "finished", flush=True)
""")
)


def _playbook_launch(tmp_path, out, send_at=None):
    return run_signalled(
        tmp_path / "playbook_fit.py",
        PREEMPTED,
        [str(out), "120"],
        signal.SIGTERM if send_at is not None else None,
        signal_at(send_at or 0),
    )


def _log_lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc/self/fd")
def test_the_strategys_records_go_through_the_guards_one_loss_log_writer(tmp_path):
    """The playbook's loss log has one writer, the guard: the strategy's own records (the preemption save's, the
    resumed launch's interruption) go through it, each once, in step order among the losses, and no second handle
    on the file is open (the strategy used to open its own: two buffers on one file)."""
    out = tmp_path / "run"
    rc, lines, err = _playbook_launch(tmp_path, out, send_at=20)
    assert rc == 0, err[-3000:]
    done = lines[-1].split()
    assert done[2] == "preempted" and 20 <= int(done[1]) < 120, lines[-3:]
    step = int(done[1])
    assert "handles 1" in lines, lines[-3:]
    first = _log_lines(out / METRICS_FILE)
    assert [r.get("step") for r in first[:-1]] == list(
        range(1, step + 1)
    )  # the guard's losses, in order
    assert first[-1]["event"] == "checkpoint-strategy:preemption" and first[-1]["step"] == step
    rc2, lines2, err2 = _playbook_launch(tmp_path, out)  # resumes from the preemption save
    assert rc2 == 0 and lines2[-1] == "done 120 finished", err2[-3000:]
    assert "handles 1" in lines2, lines2[-3:]
    second = _log_lines(out / METRICS_FILE)  # this launch's (the first one's was set aside)
    assert second[0]["event"] == "checkpoint-strategy:interruption", second[:2]
    assert (second[0]["kind"], second[0]["at_step"], second[0]["count"]) == ("preemption", step, 1)
    assert [r.get("step") for r in second[1:]] == list(range(step + 1, 121))


def test_a_fit_resumed_from_a_resumed_fits_save_draws_the_same_batches(tmp_path):
    """Lightning 2.6.6 resuming from a save at an epoch's last batch never counts the next epoch ready/started, so
    the resumed fit's saves make a fit resumed from one of them draw an epoch again (found by the second rollback
    under DDP, tests/test_callbacks_playbook_ddp.py; without the playbook's count the batch of step 201 comes at
    step 251). Three fits with fit_with_recovery, each from the last one's save at an epoch end (steps 100, 250):
    every step of every fit draws the batch a straight fit draws there."""
    from checkpoint_strategy.callbacks import fit_with_recovery

    drawn: dict[int, float] = {}

    class Drawn(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, idx):
            drawn[trainer.global_step + 1] = float(batch[0][0, 0])

    resume = None
    for stop, name in ((100, "epoch=1-step=100.ckpt"), (250, "epoch=4-step=250.ckpt"), (300, None)):
        trainer, model, loader = _fit_parts(tmp_path)
        trainer.callbacks.append(Drawn())
        trainer.fit_loop.epoch_loop.max_steps = stop
        out = fit_with_recovery(trainer, model, train_dataloaders=loader, ckpt_path=resume)
        assert out["fits"] == 1 and out["global_step"] == stop and out["rollbacks"] == []
        resume = str(tmp_path / name) if name else None
    assert sorted(drawn) == list(range(1, 301))
    straight = {
        s: float(callbackruns._pb_item((s - 1) * callbackruns.PB_BATCH)[0][0]) for s in drawn
    }
    assert drawn == straight, [s for s in drawn if drawn[s] != straight[s]][:3]
