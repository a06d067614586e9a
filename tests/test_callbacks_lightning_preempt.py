"""Preemption with LightningCheckpointStrategy (callbacks/preempt.py): a real Lightning fit in a subprocess gets
SIGTERM / SIGUSR1 mid-run, or during a save."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path
from typing import Optional

import pytest
from callbackruns import PL_PREEMPT_FIT, run_signalled, signal_at

pytest.importorskip("pytorch_lightning")

from checkpoint_strategy.callbacks.core import METRICS_FILE  # noqa: E402
from checkpoint_strategy.callbacks.preempt import RECORD_FILE, read_record  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 120

# the fit of tests/callbackruns.py PL_PREEMPT_FIT (one batch an epoch: every save at an epoch end), its module with a
# validation step
SCRIPT = (
    textwrap.dedent("""
    import io, json, os, sys, time, torch
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.plugins.io import TorchCheckpointIO
    from checkpoint_strategy.callbacks import LightningCheckpointStrategy, last_valid_checkpoint

    out, steps, signals = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    slow, grace = (float(sys.argv[4]), float(sys.argv[5])) if len(sys.argv) > 5 else (0.0, 120.0)
    torch.set_num_threads(1)

""")
    + PL_PREEMPT_FIT
    + textwrap.dedent('''
    class ValNet(Net):
        def validation_step(self, batch, _idx):
            print(f"val {self.trainer.global_step}", flush=True)

    class Progress(pl.Callback):
        def on_train_start(self, trainer, module):
            print("mins", trainer.min_steps, trainer.min_epochs, flush=True)
        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            print(f"loss {trainer.global_step} {float(outputs['loss']):.8f}", flush=True)
            print(f"step {trainer.global_step}", flush=True)
            time.sleep(0.02)
            if trainer.global_step == int(os.environ.get("FIT_STOP_AT", "0")):
                trainer.should_stop = True  # an early stop (no signal)

    class SlowIO(TorchCheckpointIO):
        """The first save is slowed in its middle: half of the file written, the rest after `slow` seconds."""
        slowed = False
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            if not slow or SlowIO.slowed:
                return super().save_checkpoint(checkpoint, path, storage_options)
            SlowIO.slowed = True
            buf = io.BytesIO()
            torch.save(checkpoint, buf)
            raw = buf.getvalue()
            with open(path, "wb") as fh:
                fh.write(raw[: len(raw) // 2])
                fh.flush()
                print(f"saving {path}", flush=True)
                time.sleep(slow)
                fh.write(raw[len(raw) // 2:])

    kw = {} if signals == "auto" else {"preemption_signals": [s for s in signals.split(",") if s]}
    cb = LightningCheckpointStrategy({"frequency": "every_50_steps", "keep_last": 3}, handoff_dir=None,
                                     grace_seconds=grace, **kw)
    mc = ModelCheckpoint(dirpath=out, save_top_k=-1)
    # FIT_VAL: a validation loader, checked every 1000 steps (never in this fit) but when should_stop is set
    val = None
    if os.environ.get("FIT_VAL"):
        val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:64], y[:64]), batch_size=32)
    vkw = {"check_val_every_n_epoch": None, "val_check_interval": 1000, "num_sanity_val_steps": 0} if val else {}
    trainer = pl.Trainer(max_steps=steps, callbacks=[cb, Progress(), mc], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, log_every_n_steps=1,
                         plugins=[SlowIO()], default_root_dir=out, **vkw,
                         **json.loads(os.environ.get("FIT_MINS", "{}")))
    if os.environ.get("FIT_NO_SKIP_FLAG"):  # as a Lightning before 2.5: no one-shot flag to skip a validation
        trainer.fit_loop.epoch_loop._skip_next_val = None
    trainer.fit(ValNet(), loader, val, ckpt_path=last_valid_checkpoint(out))
    print("skip", trainer.fit_loop.epoch_loop._skip_next_val, "_should_check_val_fx" in vars(trainer.fit_loop.epoch_loop),
          flush=True)
    print("mins", trainer.min_steps, trainer.min_epochs, flush=True)
    print("done", trainer.global_step, "preempted" if cb.preempted else "finished", flush=True)
''')
)


def _launch(
    tmp_path: Path,
    out: Path,
    signals: str = "auto",
    send=None,
    at_step: int = 20,
    slow=None,
    mins: str = "{}",
    env: Optional[dict] = None,
):
    """slow (seconds, grace): the first save (step 50) sleeps that long half-written; the signal is sent as it
    starts. mins: the Trainer's min_steps / min_epochs (JSON). Returns (exit code, stdout lines, stderr)."""
    extra = [] if slow is None else [str(slow[0]), str(slow[1])]
    return run_signalled(
        tmp_path / "fit.py",
        SCRIPT,
        [str(out), str(STEPS), signals, *extra],
        send,
        signal_at(at_step, slow is not None),
        {"FIT_MINS": mins, **(env or {})},
    )


def _losses(lines: list[str]) -> dict[int, float]:
    return {int(x.split()[1]): float(x.split()[2]) for x in lines if x.startswith("loss ")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    """The losses of the same fit without a signal."""
    tmp = tmp_path_factory.mktemp("pl-uninterrupted")
    rc, lines, err = _launch(tmp, tmp / "run")
    assert rc == 0, err[-3000:]
    return _losses(lines)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_lightning_a_signal_mid_fit_saves_a_resume_point_exits_0_and_the_rerun_continues(
    tmp_path, sig, uninterrupted
):
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, send=sig)
    assert rc == 0, err[-3000:]
    done = lines[-1].split()
    assert done[0] == "done" and done[2] == "preempted" and 20 <= int(done[1]) < STEPS, lines[-3:]
    step = int(done[1])
    assert max(_losses(lines)) == step  # no step trained after the preemption save
    name = f"epoch={step - 1}-step={step}.ckpt"
    rec = read_record(out)
    assert rec is not None and rec["signal"] == sig.name and rec["step"] == step
    assert rec["checkpoint"] == str(out / name)
    assert last_valid_checkpoint(out, level="full") == str(out / name)
    assert f"{sig.name}: preemption save {name} (step {step})" in err
    assert sorted(p.name for p in out.glob("*.ckpt")) == [
        name
    ]  # ModelCheckpoint made no second file of it
    rc2, lines2, err2 = _launch(tmp_path, out)  # the next launch resumes from it
    assert rc2 == 0 and lines2[-1] == f"done {STEPS} finished", err2[-3000:]
    assert min(_losses(lines2)) == step + 1
    # the resumed launch is one interruption of the run, a preemption's, in the loss log
    recs = [json.loads(x) for x in (out / METRICS_FILE).read_text().splitlines() if '"event"' in x]
    assert [(r["event"], r["kind"], r["at_step"], r["count"]) for r in recs] == [
        ("checkpoint-strategy:interruption", "preemption", step, 1)
    ]
    resumed, whole = {**_losses(lines), **_losses(lines2)}, uninterrupted
    assert set(resumed) == set(whole) == set(range(1, STEPS + 1))
    assert all(
        resumed[s] == pytest.approx(whole[s], rel=1e-5, abs=1e-7)
        for s in range(step + 1, STEPS + 1)
    )


def test_lightning_a_signal_during_a_save_finishes_that_save_as_the_preemption_save(tmp_path):
    """SIGTERM while the step-50 save is half-written, 1.6 s long against a 1 s grace: the save gets the grace once
    more, finishes, and is itself the preemption save; the fit stops there; exit 0."""
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, send=signal.SIGTERM, slow=(1.6, 1.0))
    assert rc == 0, err[-3000:]
    assert lines[-1] == "done 50 preempted" and read_record(out)["step"] == 50
    assert last_valid_checkpoint(out, level="full") == str(out / "epoch=49-step=50.ckpt")
    assert "the grace period ended during a save" in err


def test_lightning_a_save_that_outlasts_the_grace_is_moved_aside_never_left_looking_whole(tmp_path):
    """The same save, slowed past twice the grace: the half-written file is renamed aside and the signal's own action
    (the handler from before the fit: the default, not Lightning's flag) ends the process."""
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, send=signal.SIGTERM, slow=(8.0, 1.0))
    assert rc == -signal.SIGTERM, err[-3000:]
    assert not (out / "epoch=49-step=50.ckpt").exists()
    assert (out / "epoch=49-step=50.ckpt.abandoned-preemption").is_file()
    assert last_valid_checkpoint(out) is None and read_record(out) is None
    assert "moved to epoch=49-step=50.ckpt.abandoned-preemption" in err


def test_lightning_preemption_off_leaves_the_signal_to_lightning(tmp_path):
    """preemption_signals=(): Lightning's own SIGTERM handling (it stops the fit; no preemption save, no record)."""
    rc, lines, _ = _launch(tmp_path, tmp_path / "run", signals="", send=signal.SIGTERM)
    assert not (tmp_path / "run" / RECORD_FILE).exists()
    assert not any(x.startswith("done") and x.endswith("preempted") for x in lines)


@pytest.mark.parametrize(
    "mins, said",
    [({"min_steps": STEPS}, "min_steps=120"), ({"min_epochs": STEPS}, "min_epochs=120")],
    ids=["min_steps", "min_epochs"],
)
def test_lightning_a_preemption_stops_the_fit_before_min_steps_or_min_epochs(tmp_path, mins, said):
    """Lightning ignores should_stop until min_steps / min_epochs are met (early stopping's floor): the fit would
    train on past the preemption save and be killed after the grace. The save stops it there; the Trainer's limits
    are back after the fit; one WARNING at the fit start says so."""
    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, send=signal.SIGTERM, mins=json.dumps(mins))
    assert rc == 0, err[-3000:]
    done = lines[-1].split()
    assert done[0] == "done" and done[2] == "preempted" and 20 <= int(done[1]) < STEPS, lines[-3:]
    step = int(done[1])
    assert max(_losses(lines)) == step  # no step trained after the preemption save
    assert read_record(out)["step"] == step
    at_start = [x for x in lines if x.startswith("mins ")]
    assert (
        len(at_start) == 2 and at_start[0] == at_start[1] == lines[-2]
    )  # the Trainer's own, back after the fit
    warned = [
        x for x in err.splitlines() if "not met yet: a preemption signal still stops the fit" in x
    ]
    assert len(warned) == 1 and said in warned[0], err[-3000:]
    assert "Training will continue" not in err


@pytest.mark.parametrize(
    "flag, after",
    [("", "skip False False"), ("1", "skip None False")],
    ids=["skip-flag", "before-2.5-no-flag"],
)
def test_lightning_a_preemption_stops_without_the_validation_pass_of_a_stop(tmp_path, flag, after):
    """Lightning validates when should_stop is set (early stopping's last look at its metric): after the preemption
    save that pass would spend the grace period (a long one is killed: exit code not 0). The validation loader is
    checked every 1000 steps, so only that pass could run in this fit: none runs after the signal; exit 0; the
    preemption save is the last checkpoint. With Lightning's one-shot skip flag, and without it (a Lightning before
    2.5: the loop's check overridden for the fit); either is back to Lightning's own after the fit."""
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    out = tmp_path / "run"
    env = {"FIT_VAL": "1", "FIT_NO_SKIP_FLAG": flag}
    rc, lines, err = _launch(tmp_path, out, send=signal.SIGTERM, env=env)
    assert rc == 0, err[-3000:]
    done = lines[-1].split()
    assert done[0] == "done" and done[2] == "preempted" and 20 <= int(done[1]) < STEPS, lines[-3:]
    step = int(done[1])
    assert max(_losses(lines)) == step
    assert not [x for x in lines if x.startswith("val ")], lines[
        -6:
    ]  # no validation step ran at all
    name = f"epoch={step - 1}-step={step}.ckpt"
    assert sorted(p.name for p in out.glob("*.ckpt")) == [name]
    assert (
        last_valid_checkpoint(out, level="full")
        == str(out / name)
        == read_record(out)["checkpoint"]
    )
    assert lines[-3] == after


def test_lightning_an_early_stop_without_preemption_still_validates_at_the_stop(tmp_path):
    """The control: the same fit, a callback sets should_stop at step 30 (no signal, preemption on): Lightning's
    validation pass at the stop runs as before."""
    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, env={"FIT_VAL": "1", "FIT_STOP_AT": "30"})
    assert rc == 0, err[-3000:]
    assert lines[-1] == "done 30 finished", lines[-3:]
    assert read_record(out) is None
    vals = [x for x in lines if x.startswith("val ")]
    assert vals and set(vals) == {"val 30"}, lines[-8:]
    assert lines.index(vals[0]) > lines.index("step 30")
