"""Real tiny training runs with the checkpoint-strategy callbacks (HF Trainer and Lightning, CPU).

Same model, data and schedule as tests/realruns.py; each builder returns the output folder and
the callback, so tests can read the callback's records.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import realruns
from cliresult import checkout_env, end_job


def run_signalled(
    script: Path,
    text: str,
    argv: list[str],
    send=None,
    when: Optional[Callable[[str], bool]] = None,
    env: Optional[dict] = None,
) -> tuple[int, list[str], str]:
    """A training script in a subprocess (the preemption tests): `text` written to `script` and run with argv,
    this checkout's scripts/ on its PYTHONPATH (env: more variables); signal `send` goes to it at the first
    stdout line (stripped) `when` accepts. Returns (exit code, its stdout lines stripped, its stderr). Bounded: a
    script still running after 300 s is killed (exit -9; reading its stdout had no bound of its own); its stderr is
    read beside its stdout (a script that fills the stderr pipe while we wait for stdout would block for ever)."""
    import threading

    script.write_text(text)
    proc = subprocess.Popen(
        [sys.executable, str(script), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=checkout_env(**(env or {})),
    )
    assert proc.stdout is not None and proc.stderr is not None
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if send is not None and when is not None and when(line.strip()):
                proc.send_signal(send)
                send = None
        reader.join(60)
        return proc.wait(timeout=60), lines, "".join(err)
    finally:
        watchdog.cancel()


# The Lightning fit of the preemption scripts (tests/test_callbacks_lightning_preempt.py, the playbook's in
# tests/test_callbacks_lightning_playbook.py), inserted after their imports (torch, pytorch_lightning as pl): one
# batch an epoch, the epoch's own (a sampler Lightning tells the epoch), so every save is at an epoch end and a resumed
# fit draws the same batches as an uninterrupted one; `loader` and the module `Net` (AdamW; no validation step).
PL_PREEMPT_FIT = textwrap.dedent("""
    class EpochSampler(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = 0
        def set_epoch(self, epoch):
            self.epoch = epoch
        def __len__(self):
            return 32
        def __iter__(self):
            return iter(range(self.epoch * 32 % 4096, self.epoch * 32 % 4096 + 32))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.3 * torch.randn(4096, 1, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, sampler=EpochSampler())

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        def training_step(self, batch, _idx):
            xb, yb = batch
            return torch.nn.functional.mse_loss(self.net(xb), yb)
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3)
""")


def signal_at(step: int, slowed: bool = False) -> Callable[[str], bool]:
    """Where run_signalled's signal goes in the preemption scripts: at the line `step N`, or (slowed) as the slowed
    save starts (`saving ...`)."""
    return (lambda x: x.startswith("saving")) if slowed else (lambda x: x == f"step {step}")


def nan_callback(nan_step: int):
    """Fills every weight with NaN at the end of `nan_step`: every later loss is NaN."""
    import torch
    from transformers import TrainerCallback

    class Nan(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == nan_step:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(math.nan)
            return control

    return Nan()


def hf_train(
    out: Path,
    policy,
    *,
    max_steps: int = 60,
    spike_step: Optional[int] = None,
    spike_scale: float = 4.0,
    nan_step: Optional[int] = None,
    best_oldest: bool = False,
    hooks: Optional[dict] = None,
    resume: Optional[str] = None,
    extra_callbacks=(),
    **cb_kwargs,
):
    """Train the tiny GPT-2 with HFCheckpointStrategy(policy). best_oldest: evaluate at every save
    with greater_is_better=True on eval_loss, so the Trainer's "best" is the *worst* (earliest)
    checkpoint: a best that keep_last would otherwise rotate away."""
    from transformers import Trainer

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    cb = HFCheckpointStrategy(policy, **cb_kwargs)
    for name, fn in (hooks or {}).items():
        setattr(cb.core, name, fn)
    args = realruns._training_args(out, max_steps=max_steps, save_steps=500)
    args.save_total_limit = 3  # turned off by the callback
    args.logging_nan_inf_filter = False  # log a NaN loss as NaN
    eval_ds = None
    if best_oldest:
        args.eval_strategy = "steps"
        args.eval_steps = cb.core.frequency
        args.metric_for_best_model = "eval_loss"
        args.greater_is_better = True
        eval_ds = realruns._TokenDataset(32, 16, 64, seed=1)
    callbacks = [realruns._spike_callback(spike_step, spike_scale), cb, *extra_callbacks]
    if nan_step is not None:
        callbacks.append(nan_callback(nan_step))
    trainer = Trainer(
        model=realruns._tiny_gpt2(),
        args=args,
        train_dataset=realruns._TokenDataset(4096, 16, 64),
        eval_dataset=eval_ds,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume)
    return cb, trainer


def steps_in(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in Path(out).glob("checkpoint-*"))


def lightning_train(
    ckpt_dir: Path,
    policy,
    *,
    max_steps: int = 60,
    spike_step: Optional[int] = None,
    spike_scale: float = 3.0,
    nan_step: Optional[int] = None,
    hooks: Optional[dict] = None,
    resume: Optional[str] = None,
    monitor: Optional[str] = None,
    extra_callbacks=(),
    save_top_k: int = 1,
    plugins=None,
    devices: int = 1,
    strategy: str = "auto",
    with_callback: bool = True,
    save_every: int = 10,
    default_logger: bool = False,
    monitor_every: Optional[int] = None,
    **cb_kwargs,
):
    """A real Lightning fit with LightningCheckpointStrategy(policy): a small MLP on a noisy regression
    (loss stays well above 0), AdamW, logging every step. spike_step: weights blown up at the end of
    that step; nan_step: every weight NaN at the end of that step (every later loss is NaN). Returns
    (callback, trainer, module). devices=2, strategy="ddp": two processes (gloo; run this from a script,
    Lightning starts the second process by running it again); with_callback=False: the same run without
    the callback (callback None; ModelCheckpoint then saves every `save_every` steps itself). default_logger:
    Lightning's default logger and ModelCheckpoint folder (no dirpath): ckpt_dir is then the Trainer's
    default_root_dir and the checkpoints go to ckpt_dir/lightning_logs/version_N/checkpoints. monitor_every: the
    ModelCheckpoint's own every_n_train_steps (a monitoring one the callback leaves alone)."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint

    from checkpoint_strategy.callbacks import LightningCheckpointStrategy

    realruns._seed(0)
    torch.set_num_threads(1)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
            )

        def training_step(self, batch, _idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    class Spike(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            if spike_step is not None and trainer.global_step == spike_step:
                g = torch.Generator().manual_seed(1)
                with torch.no_grad():
                    for p in module.parameters():
                        p.add_(
                            torch.randn(p.shape, generator=g)
                            * spike_scale
                            * p.detach().std().nan_to_num(0.05).clamp_min(0.05)
                        )
            if nan_step is not None and trainer.global_step == nan_step:
                with torch.no_grad():
                    for p in module.parameters():
                        p.fill_(math.nan)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.3 * torch.randn(4096, 1, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    cb = LightningCheckpointStrategy(policy, **cb_kwargs) if with_callback else None
    for name, fn in (hooks or {}).items():
        if cb is not None:
            setattr(cb.core, name, fn)
    mc = ModelCheckpoint(
        dirpath=None if default_logger else str(ckpt_dir),
        save_top_k=save_top_k,
        monitor=monitor,
        mode="max" if monitor else "min",
        every_n_train_steps=monitor_every or (None if with_callback else save_every),
    )
    ours = [cb] if cb is not None else []
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=[Spike(), *ours, mc, *extra_callbacks],
        logger=default_logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        log_every_n_steps=1,
        plugins=plugins,
        default_root_dir=str(ckpt_dir if default_logger else Path(ckpt_dir).parent),
    )
    module = Net()
    trainer.fit(module, loader, ckpt_path=resume)
    return cb, trainer, module


def lightning_steps(ckpt_dir: Path) -> list[str]:
    return sorted(p.name for p in Path(ckpt_dir).glob("*.ckpt"))


GUARD_STEPS, GUARD_POISON = 500, 200


def guard_ddp(out: Path) -> None:
    """One rank of a 2-process (torchrun, gloo) nanoGPT-style loop with TrainingGuard: DDP, each rank its own
    batches, a poisoned batch at GUARD_POISON (it damages the weights on every rank); rank 0 saves, every rank
    loads on the guard's rollback. Writes out/result-<rank>.json: the guard's summary and the last trained step."""
    import json

    import torch
    import torch.distributed as dist

    from checkpoint_strategy.callbacks.guard import TrainingGuard

    out.mkdir(parents=True, exist_ok=True)  # a retried run's folder was removed (cliresult.run_job)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    guard = TrainingGuard(out, frequency_steps=50, rank_timeout=120.0)
    step, last = 0, 0
    while step < GUARD_STEPS:
        step += 1
        if guard.skip(step):
            continue
        g = torch.Generator().manual_seed(1000 + step + 10**6 * rank)
        x = torch.randn(32, 8, generator=g)
        y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1).tanh() + 0.3 * torch.randn(
            32, 1, generator=g
        )
        if step == GUARD_POISON:
            with torch.no_grad():
                model[0].weight.mul_(-50)
                model[0].bias.mul_(-50)
        for pg in opt.param_groups:
            pg["lr"] = 3e-3 * guard.lr_scale(step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), guard.grad_clip(step) or 1e9)
        opt.step()
        last = step
        d = guard.step(step, float(loss.detach()), grad_norm=float(gn))
        if d.action == "save":
            path = out / f"checkpoint-{step}.pt"
            if rank == 0:
                torch.save(
                    {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                    str(path) + ".tmp",
                )
                os.replace(str(path) + ".tmp", path)
            dist.barrier()
            guard.saved(step, path)
        elif d.action == "rollback":
            ck = torch.load(d.checkpoint)
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            step = int(d.resume_step)
            if guard.resumed(opt).action == "stop":
                break
        elif d.action == "stop":
            break
    summary = guard.close()
    end_job({out / f"result-{rank}.json": json.dumps({"last": last, **summary}, default=str)})


# ----------------------------------------------------------------- the playbooks under 2 processes (issue 43)

PB_STEPS, PB_POISON, PB_BATCH, PB_EPOCH = 600, 300, 32, 50
PB_LR_STEPS = (
    100  # the LR window after a rollback: 500 (the default) would halve the LR to the run's end
)


def _pb_item(i: int):
    import torch

    g = torch.Generator().manual_seed(1000 + i)
    x = torch.randn(8, generator=g)
    return x, (x @ torch.linspace(-1, 1, 8)).tanh().unsqueeze(0) + 0.3 * torch.randn(1, generator=g)


def pb_eval(net) -> float:
    import torch

    items = [_pb_item(10**7 + i) for i in range(512)]
    x, y = torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(net(x), y))


def _pb_fingerprint(net) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().double().numpy().tobytes())
    return h.hexdigest()


def _pb_net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def _pb_finish(out: Path, rank: int, doc: dict) -> None:
    """Write out/result-<rank>.json and leave as every real multi-process job does (cliresult.end_job)."""
    import json

    end_job({out / f"result-{rank}.json": json.dumps(doc, default=str)})


def hf_playbook_ddp(
    out: Path,
    poison: bool,
    forget_rank: Optional[int] = None,
    poison_steps: tuple[int, ...] = (PB_POISON,),
    max_rollbacks: int = 3,
) -> None:
    """One rank of a 2-process torchrun (gloo, CPU) HF Trainer with train_with_recovery. Global batch b (rank b % 2,
    accelerate's sharding) belongs to step b // 2 + 1; poison: the batches of step PB_POISON (one on each rank)
    multiply the first layer by -50 in the forward pass (every rank's weights damaged alike; poison_steps: the steps
    so poisoned, PB_POISON alone by default; max_rollbacks: train_with_recovery's). Writes
    out/result-<rank>.json (forget_rank: that rank's resume loads no optimizer state, a fresh optimizer, as a
    broken per-rank resume would): train_with_recovery's answer, calls: each trainer.train call (its resume checkpoint and the
    step it started from), the steps whose forward pass ran, a fingerprint of the weights before each step ("at",
    the last pass's), the steps a poisoned batch came at, the held-out loss
    and a fingerprint of the weights."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from checkpoint_strategy.callbacks import HFCheckpointStrategy, train_with_recovery

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    seen: dict = {"forward": [], "poisoned": [], "calls": [], "at": {}}

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 2 * PB_STEPS * PB_BATCH

        def __getitem__(self, i):
            x, y = _pb_item(i)
            step = (i // PB_BATCH) // 2 + 1
            return {"x": x, "y": y, "poison": torch.tensor(float(poison and step in poison_steps))}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _pb_net()
            self.step_now = 0

        def forward(self, x, y, poison):
            seen["forward"].append(self.step_now)
            if poison.any():
                seen["poisoned"].append(self.step_now)
                with torch.no_grad():
                    self.net[0].weight.mul_(-50)
                    self.net[0].bias.mul_(-50)
            return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}

    class StepNow(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            net.step_now = state.global_step + 1

    net = Net()
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=PB_STEPS,
        per_device_train_batch_size=PB_BATCH,
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
        ddp_backend="gloo",
    )
    cb = HFCheckpointStrategy({"frequency": "every_50_steps", "keep_last": 20}, handoff_dir=None)
    tr = Trainer(model=net, args=args, train_dataset=Data(), callbacks=[cb, StepNow()])
    tr._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(tr.train_dataset)
    plain_train = tr.train

    def train(*a, **k):
        seen["calls"].append({"resume": k.get("resume_from_checkpoint"), "from_step": None})
        return plain_train(*a, **k)

    class FirstStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if seen["calls"] and seen["calls"][-1]["from_step"] is None:
                seen["calls"][-1]["from_step"] = state.global_step
            seen["at"][state.global_step] = _pb_fingerprint(
                net.net
            )  # the weights before this step (the last pass's)

    tr.add_callback(FirstStep())
    tr.train = train
    if forget_rank == rank:
        plain_load = tr._load_optimizer_and_scheduler

        def forgetful(checkpoint):
            plain_load(None)
            getattr(tr.optimizer, "optimizer", tr.optimizer).state.clear()

        tr._load_optimizer_and_scheduler = forgetful
    result = train_with_recovery(tr, lr_reduced_steps=PB_LR_STEPS, max_rollbacks=max_rollbacks)
    _pb_finish(
        out, rank, {**result, **seen, "eval": pb_eval(net.net), "weights": _pb_fingerprint(net.net)}
    )


def pl_data(
    poison: bool, label_spike: Optional[int] = None, poison_steps: tuple[int, ...] = (PB_POISON,)
):
    """Rank r's items: r * PB_STEPS * PB_BATCH onwards, PB_BATCH a step; the batches of poison_steps (PB_POISON
    alone by default) flagged (poison), the labels of step label_spike x30 (a spike that recovers)."""
    import torch

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 2 * PB_STEPS * PB_BATCH

        def __getitem__(self, i):
            x, y = _pb_item(i)
            step = (i % (PB_STEPS * PB_BATCH)) // PB_BATCH + 1
            spike = 30.0 if step == label_spike else 1.0
            return x, y * spike, torch.tensor(float(poison and step in poison_steps))

    return Data()


def pl_sampler():
    """Epoch e on rank r (0 without a process group): the batches of steps e*PB_EPOCH+1 .. (e+1)*PB_EPOCH of rank
    r's items (Lightning calls set_epoch): each save, every 50 steps, is at an epoch end, so a resume draws the same
    batches."""
    import torch

    class Sampler(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __len__(self):
            return PB_EPOCH * PB_BATCH

        def __iter__(self):
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            base = rank * PB_STEPS * PB_BATCH + self.epoch * PB_EPOCH * PB_BATCH
            return iter(range(base, base + PB_EPOCH * PB_BATCH))

    return Sampler()


def pl_net(seen: Optional[dict] = None):
    """The playbook's Lightning module: a batch flagged poison multiplies the first layer by -50 in its forward
    pass. seen: gets the steps whose forward pass ran ("forward") and those a poisoned batch came at."""
    import pytorch_lightning as lightning
    import torch

    class Net(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _pb_net()

        def training_step(self, batch, _idx):
            x, y, p = batch
            step = self.trainer.global_step + 1
            if seen is not None:
                seen["forward"].append(step)
            if p.any():
                if seen is not None:
                    seen["poisoned"].append(step)
                with torch.no_grad():
                    self.net[0].weight.mul_(-50)
                    self.net[0].bias.mul_(-50)
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.0)

    return Net()


def pl_trainer(out: Path, with_strategy: bool = True, extra_callbacks=(), **trainer_kw):
    """The playbook's Lightning Trainer: PB_STEPS steps, LightningCheckpointStrategy (every 50 steps, keep 20) unless
    with_strategy=False, a ModelCheckpoint saving every 50 steps into `out`, then extra_callbacks."""
    import pytorch_lightning as lightning
    from pytorch_lightning.callbacks import ModelCheckpoint

    from checkpoint_strategy.callbacks import LightningCheckpointStrategy

    ours = (
        [LightningCheckpointStrategy({"frequency": "every_50_steps", "keep_last": 20})]
        if with_strategy
        else []
    )
    mc = ModelCheckpoint(dirpath=str(out), save_top_k=-1, every_n_train_steps=50)
    return lightning.Trainer(
        max_steps=PB_STEPS,
        callbacks=[*ours, mc, *extra_callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        log_every_n_steps=1,
        **trainer_kw,
    )


def pl_playbook_ddp(
    out: Path,
    poison: bool,
    forget_rank: Optional[int] = None,
    poison_steps: tuple[int, ...] = (PB_POISON,),
    max_rollbacks: int = 3,
) -> None:
    """One rank of a 2-process Lightning DDP fit (Trainer(strategy="ddp", devices=2), gloo, CPU; Lightning starts
    rank 1 by running this program again) with fit_with_recovery. Each rank draws its own batches (rank r: the
    items of its own half), epoch e the batches of steps e*PB_EPOCH+1 .. (e+1)*PB_EPOCH (each save, every 50
    steps, is at an epoch end: a resume draws the same batches); poison: the batch of step PB_POISON on every rank
    multiplies the first layer by -50 (poison_steps: the steps so poisoned, PB_POISON alone by default;
    max_rollbacks: fit_with_recovery's; forget_rank: that rank's resume restores no optimizer state). Writes
    out/result-<rank>.json as hf_playbook_ddp does (calls: each
    trainer.fit call's ckpt_path and first step)."""
    import pytorch_lightning as lightning
    import torch

    from checkpoint_strategy.callbacks import fit_with_recovery

    torch.set_num_threads(1)
    seen: dict = {"forward": [], "poisoned": [], "calls": [], "at": {}}

    class FirstStep(lightning.Callback):
        def on_train_batch_start(self, trainer, module, batch, idx):
            if seen["calls"] and seen["calls"][-1]["from_step"] is None:
                seen["calls"][-1]["from_step"] = trainer.global_step
            seen["at"][trainer.global_step] = _pb_fingerprint(
                module.net
            )  # the weights before this step

    trainer = pl_trainer(
        out, extra_callbacks=[FirstStep()], devices=2, strategy="ddp", use_distributed_sampler=False
    )
    plain_fit = trainer.fit

    def fit(*a, **k):
        seen["calls"].append({"resume": k.get("ckpt_path"), "from_step": None})
        return plain_fit(*a, **k)

    trainer.fit = fit
    if forget_rank is not None and forget_rank == int(os.environ.get("LOCAL_RANK", "0")):
        # that rank's resume restores the weights, not the optimizers (the fresh ones configure_optimizers made)
        trainer._checkpoint_connector.restore_optimizers_and_schedulers = lambda: None
    model = pl_net(seen)
    loader = torch.utils.data.DataLoader(
        pl_data(poison, poison_steps=poison_steps), batch_size=PB_BATCH, sampler=pl_sampler()
    )
    result = fit_with_recovery(
        trainer,
        model,
        train_dataloaders=loader,
        lr_reduced_steps=PB_LR_STEPS,
        max_rollbacks=max_rollbacks,
    )
    _pb_finish(
        out,
        trainer.global_rank,
        {**result, **seen, "eval": pb_eval(model.net), "weights": _pb_fingerprint(model.net)},
    )


PREEMPT_STEP = 30


def guard_preempt_ddp(out: Path) -> None:
    """One rank of a 2-process (torchrun, gloo) DDP loop with TrainingGuard(preemption_signals=["SIGUSR1"]): rank 1
    alone signals itself at the start of step PREEMPT_STEP. Writes out/result-<rank>.json: the last step trained,
    the guard's stop, its preemption record, the kinds of its saves and whether a collective of it timed out."""
    import json
    import signal

    import torch
    import torch.distributed as dist

    from checkpoint_strategy.callbacks.guard import TrainingGuard

    out.mkdir(parents=True, exist_ok=True)  # a retried run's folder was removed (cliresult.run_job)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    guard = TrainingGuard(
        out, frequency_steps=20, rank_timeout=60.0, preemption_signals=["SIGUSR1"]
    )
    step, last = 0, 0
    while step < 100:
        step += 1
        if rank == 1 and step == PREEMPT_STEP:
            os.kill(os.getpid(), signal.SIGUSR1)
        g = torch.Generator().manual_seed(1000 + step + 10**6 * rank)
        x = torch.randn(32, 8, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True).tanh())
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = step
        d = guard.step(step, float(loss.detach()))
        if d.action == "save":
            path = out / f"checkpoint-{step}.pt"
            if rank == 0:
                torch.save(
                    {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                    str(path) + ".tmp",
                )
                os.replace(str(path) + ".tmp", path)
            dist.barrier()
            guard.saved(step, path)
            if d.stop:
                break
        elif d.action == "stop":
            break
    broken = guard.ranks.broken
    summary = guard.close()
    doc = {
        "last": last,
        "stopped": summary["stopped"],
        "preempted": guard.preempted,
        "broken": broken,
        "saves": [(s.step, s.kind) for s in guard.saves],
    }
    end_job({out / f"result-{rank}.json": json.dumps(doc, default=str)})


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "guard":
        guard_ddp(Path(sys.argv[2]))
    elif sys.argv[1] == "guard_preempt":
        guard_preempt_ddp(Path(sys.argv[2]))
    elif sys.argv[1] in ("hf_playbook", "pl_playbook"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        run = {"hf_playbook": hf_playbook_ddp, "pl_playbook": pl_playbook_ddp}[sys.argv[1]]
        # after the mode: a rank (forget_rank), then keyword=value options (poison_steps=200,350 max_rollbacks=2)
        opts = dict(a.split("=", 1) for a in sys.argv[4:] if "=" in a)
        run(
            Path(sys.argv[2]),
            sys.argv[3] == "poison",
            *(int(a) for a in sys.argv[4:] if "=" not in a),
            **{
                k: tuple(map(int, v.split(","))) if k == "poison_steps" else int(v)
                for k, v in opts.items()
            },
        )
