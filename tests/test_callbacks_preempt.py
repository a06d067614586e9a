"""Preemption (callbacks/preempt.py): a real HF Trainer run in a subprocess gets SIGTERM / SIGUSR1 mid-run."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import pytest
from callbackruns import run_signalled, signal_at

pytest.importorskip("transformers")

from checkpoint_strategy.callbacks.preempt import RECORD_FILE, Preemption, read_record  # noqa: E402
from checkpoint_strategy.errors import UsageError  # noqa: E402

STEPS = 120

SCRIPT = textwrap.dedent("""
    import sys, time, torch
    from transformers import Trainer, TrainingArguments, TrainerCallback
    from checkpoint_strategy.callbacks import HFCheckpointStrategy, last_valid_checkpoint

    out, steps, signals = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    slow, grace = (float(sys.argv[4]), float(sys.argv[5])) if len(sys.argv) > 5 else (0.0, 120.0)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(1000 + i)
            x = torch.randn(8, generator=g)
            return {"x": x, "y": (x.sum() / 3).tanh().unsqueeze(0) + 0.3 * torch.randn(1, generator=g)}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        def forward(self, x, y):
            return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}

    class Progress(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            print(f"step {state.global_step}", flush=True)
            time.sleep(0.02)

    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=16, learning_rate=3e-3,
                             lr_scheduler_type="constant", logging_steps=1, save_steps=50, report_to=[], seed=0,
                             disable_tqdm=True, use_cpu=True)
    kw = {} if signals == "auto" else {"preemption_signals": [s for s in signals.split(",") if s]}
    kw["grace_seconds"] = grace
    cb = HFCheckpointStrategy({"frequency": "every_50_steps", "keep_last": 3}, handoff_dir=None, **kw)
    tr = Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[cb, Progress()])
    tr._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(tr.train_dataset)
    if slow:   # the first save is slowed in its middle: the weights written, the optimizer state not yet
        plain, slowed_once = tr._save_optimizer_and_scheduler, []
        def slowed(output_dir):
            if not slowed_once:
                slowed_once.append(1)
                print(f"saving {output_dir}", flush=True)
                time.sleep(slow)
            return plain(output_dir)
        tr._save_optimizer_and_scheduler = slowed
    tr.train(resume_from_checkpoint=last_valid_checkpoint(out))
    print("done", tr.state.global_step, "preempted" if cb.preempted else "finished", flush=True)
""")


def _launch(
    tmp_path: Path, out: Path, signals: str = "auto", send=None, at_step: int = 20, slow=None
):
    """slow (seconds, grace): the first save sleeps that long between the weights and the optimizer state, and
    the signal is sent as it starts."""
    extra = [] if slow is None else [str(slow[0]), str(slow[1])]
    return run_signalled(
        tmp_path / "train.py",
        SCRIPT,
        [str(out), str(STEPS), signals, *extra],
        send,
        signal_at(at_step, slow is not None),
    )


def _losses(out: Path, step: int) -> dict[int, float]:
    state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_mid_run_saves_a_resume_point_exits_0_and_the_rerun_continues(tmp_path, sig):
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, send=sig)
    assert rc == 0, err[-2000:]
    done = lines[-1].split()
    assert done[0] == "done" and done[2] == "preempted" and 20 <= int(done[1]) < STEPS
    step = int(done[1])
    rec = read_record(out)
    assert rec is not None and rec["signal"] == sig.name and rec["step"] == step
    assert last_valid_checkpoint(out, level="full") == str(out / f"checkpoint-{step}")
    assert any(
        f"{sig.name}: preemption save checkpoint-{step} (step {step})" in x
        for x in lines + err.splitlines()
    )
    rc2, lines2, err2 = _launch(tmp_path, out)  # the next launch resumes from it
    assert rc2 == 0 and lines2[-1] == f"done {STEPS} finished", err2[-2000:]
    assert [x for x in lines2 if x.startswith("step ")][0] == f"step {step + 1}"
    ref = tmp_path / "uninterrupted"
    assert _launch(tmp_path, ref)[0] == 0
    resumed, whole = _losses(out, STEPS), _losses(ref, STEPS)
    assert set(resumed) == set(whole) == set(range(1, STEPS + 1))
    assert all(
        resumed[s] == pytest.approx(whole[s], rel=1e-4, abs=1e-6)
        for s in range(step + 1, STEPS + 1)
    )


def test_a_signal_during_a_save_finishes_that_save_as_the_preemption_save(tmp_path):
    """SIGTERM while the first save (step 50) is being written, 2 s into a 1 s grace period: the save gets the grace
    period once more, finishes, and is itself the preemption save; exit 0."""
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, send=signal.SIGTERM, slow=(1.6, 1.0))
    assert rc == 0, err[-2000:]
    assert lines[-1] == "done 50 preempted" and read_record(out)["step"] == 50
    assert last_valid_checkpoint(out, level="full") == str(out / "checkpoint-50")
    assert (
        "the grace period ended during a save" in "\n".join(lines) + err
    )  # (the lines go through tqdm.write)


def test_a_save_that_outlasts_the_grace_is_moved_aside_never_left_looking_whole(tmp_path):
    """The same save, slowed past twice the grace: the half-written checkpoint-50 (weights, no optimizer state) is
    renamed aside before the signal ends the process: nothing resumes from it."""
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    out = tmp_path / "run"
    rc, lines, err = _launch(tmp_path, out, send=signal.SIGTERM, slow=(8.0, 1.0))
    assert rc == -signal.SIGTERM
    assert (
        not (out / "checkpoint-50").exists()
        and (out / "checkpoint-50.abandoned-preemption").is_dir()
    )
    assert last_valid_checkpoint(out) is None and read_record(out) is None
    assert "moved to checkpoint-50.abandoned-preemption" in "\n".join(lines) + err


def test_preemption_off_leaves_the_signal_alone(tmp_path):
    rc, lines, _ = _launch(tmp_path, tmp_path / "run", signals="", send=signal.SIGTERM)
    assert rc == -signal.SIGTERM and not (tmp_path / "run" / RECORD_FILE).exists()


def test_bad_signal_names_are_one_line():
    with pytest.raises(UsageError, match="SIGKILL"):
        Preemption(["SIGKILL"])
    with pytest.raises(UsageError, match="NOPE"):
        Preemption(["NOPE"])
    with pytest.raises(UsageError, match="grace_seconds"):
        Preemption(grace_seconds=0)
    assert [s.name for s in Preemption(["term", "USR1"]).signals] == ["SIGTERM", "SIGUSR1"]


def test_auto_is_off_under_many_processes_named_signals_are_on_and_uninstall_puts_back_what_was_there():
    before = signal.getsignal(signal.SIGUSR1)
    auto = Preemption("auto")
    assert auto.auto and [s.name for s in auto.signals] == ["SIGTERM", "SIGUSR1"]
    assert auto.install_for(2) is False and signal.getsignal(signal.SIGUSR1) == before
    named = Preemption("SIGUSR1")  # one name is one signal
    assert [s.name for s in named.signals] == ["SIGUSR1"]
    try:
        assert named.install_for(2) is True and signal.getsignal(signal.SIGUSR1) == named._handler
    finally:
        named.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == before
    # a framework that put its own originals back meanwhile (Lightning's teardown) keeps them
    other = Preemption("SIGUSR1")
    other.install()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    other.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    signal.signal(signal.SIGUSR1, before)
