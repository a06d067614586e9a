"""train_with_recovery (callbacks/hf_playbook.py) on a real tiny HF Trainer run on CPU with a poisoned batch."""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from checkpoint_strategy.errors import UsageError  # noqa: E402
from checkpoint_strategy.formats.runlog import METRICS_FILE  # noqa: E402

STEPS = 600
POISON = 300  # the step whose batch damages the weights (batch index 299)
BATCH = 32


class _Data(torch.utils.data.Dataset):
    def __init__(self, n, poison=None, label_spike=None):
        self.n, self.poison, self.label_spike = n, poison, label_spike

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(8, generator=g)
        y = (x @ torch.linspace(-1, 1, 8)).tanh().unsqueeze(0) + 0.3 * torch.randn(1, generator=g)
        step = i // BATCH + 1
        return {
            "x": x,
            "y": y * (30.0 if step == self.label_spike else 1.0),
            "poison": torch.tensor(float(step == self.poison)),
        }


class _Net(torch.nn.Module):
    """A bad shard: a batch flagged poison multiplies the first layer by -50 in its forward pass."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def forward(self, x, y, poison):
        if poison.any():
            with torch.no_grad():
                self.net[0].weight.mul_(-50)
                self.net[0].bias.mul_(-50)
        return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}


def _trainer(out, *, poison=None, label_spike=None, with_strategy=True):
    from transformers import Trainer, TrainingArguments

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_steps=50,
        report_to=[],
        seed=0,
        dataloader_drop_last=True,
        disable_tqdm=True,
        use_cpu=True,
        max_grad_norm=1e9,
    )
    cbs = (
        [HFCheckpointStrategy({"frequency": "every_50_steps", "keep_last": 20}, handoff_dir=None)]
        if with_strategy
        else []
    )
    tr = Trainer(
        model=_Net(),
        args=args,
        train_dataset=_Data(STEPS * BATCH, poison, label_spike),
        callbacks=cbs,
    )
    tr._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(
        tr.train_dataset
    )  # batch k = step k
    return tr


def _eval(tr) -> float:
    data = _Data(10**6)
    x = torch.stack([data[10**5 + i]["x"] for i in range(512)])
    y = torch.stack([data[10**5 + i]["y"] for i in range(512)])
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(tr.model.net(x), y))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    clean = _trainer(tmp_path_factory.mktemp("clean"), with_strategy=False)
    clean.train()
    poisoned = _trainer(tmp_path_factory.mktemp("poisoned"), poison=POISON, with_strategy=False)
    poisoned.train()
    return _eval(clean), _eval(poisoned)


def test_a_poisoned_batch_is_rolled_back_and_the_trainer_finishes(baseline, tmp_path, caplog):
    from checkpoint_strategy.callbacks import train_with_recovery

    clean, diverged = baseline
    assert diverged > 2 * clean  # without the playbook the run ends diverged
    tr = _trainer(tmp_path, poison=POISON)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        out = train_with_recovery(tr)
    assert out["global_step"] == STEPS and out["stopped"] is None and out["trains"] == 2
    assert 1 <= len(out["rollbacks"]) <= 2
    rb = out["rollbacks"][0]
    assert (
        rb["onset"] == POISON
        and rb["resume_step"] == 250
        and rb["checkpoint"] == str(tmp_path / "checkpoint-250")
    )
    assert rb["skip"] == [251, POISON + 20] and out["skipped_steps"] == list(
        range(251, POISON + 21)
    )
    assert abs(_eval(tr) - clean) <= 0.15 * clean
    assert tr.args.max_grad_norm == 1e9  # the user's clipping is back after the call
    assert any("rollback 1/3 to checkpoint-250" in r.getMessage() for r in caplog.records)
    state = json.loads((tmp_path / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    logged = {h["step"]: h for h in state["log_history"] if "loss" in h}
    assert all(
        logged[s]["loss"] < 1.0 for s in range(251, POISON + 21)
    )  # skipped: no spike, no zero drop
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


def test_lr_and_clipping_window_apply_in_the_resumed_train(tmp_path):
    from transformers import TrainerCallback

    from checkpoint_strategy.callbacks import train_with_recovery

    seen = []  # (step, LR, max_grad_norm) at each optimizer step

    class Spy(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            seen.append(
                (state.global_step + 1, optimizer.param_groups[0]["lr"], args.max_grad_norm)
            )

    tr = _trainer(tmp_path, poison=POISON)
    tr.add_callback(Spy())
    out = train_with_recovery(tr, lr_reduced_steps=100)
    rb = out["rollbacks"][0]
    assert rb["lr_until"] == 350
    resumed = seen[seen.index((rb["step"], 3e-3, 1e9)) + 1 :]
    # skipped steps make no optimizer step with a gradient but the Trainer still calls it: their LR is halved too
    assert [s for s, _, _ in resumed] == list(range(251, STEPS + 1))
    assert all((lr, clip) == (1.5e-3, 0.5) for s, lr, clip in resumed if s <= 350)
    assert all((lr, clip) == (3e-3, 1e9) for s, lr, clip in resumed if s > 350)


def test_a_spike_that_recovers_is_not_rolled_back(tmp_path):
    from checkpoint_strategy.callbacks import train_with_recovery

    out = train_with_recovery(_trainer(tmp_path, label_spike=POISON))
    assert out["rollbacks"] == [] and out["skipped_steps"] == [] and out["trains"] == 1
    assert out["global_step"] == STEPS and out["actions"][0]["event"] == "checkpoint-strategy:spike"
    assert out["actions"][1]["event"] == "checkpoint-strategy:recovered"


def test_a_trainer_without_the_strategy_is_one_line(tmp_path):
    from checkpoint_strategy.callbacks import train_with_recovery

    with pytest.raises(UsageError, match="no HFCheckpointStrategy"):
        train_with_recovery(_trainer(tmp_path, with_strategy=False))


def test_a_resume_that_drops_the_optimizer_state_stops_with_one_error(tmp_path, caplog):
    from checkpoint_strategy.callbacks import train_with_recovery

    tr = _trainer(tmp_path, poison=POISON)
    plain = tr._load_optimizer_and_scheduler

    def forgetful(
        checkpoint,
    ):  # a broken resume: the optimizer state is not loaded, it starts from nothing
        plain(None)
        getattr(tr.optimizer, "optimizer", tr.optimizer).state.clear()

    tr._load_optimizer_and_scheduler = forgetful
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        out = train_with_recovery(tr)
    rb = out["rollbacks"][0]
    assert out["trains"] == 2 and "did not restore the optimizer" in out["stopped"]
    assert (
        out["global_step"] == rb["resume_step"] + 1
    )  # stopped at the first step of the resumed train
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "step counter is 0, the checkpoint's 250" in errors[0]
