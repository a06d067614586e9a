"""Real tiny training runs with the checkpoint-strategy callbacks (HF Trainer and Lightning, CPU).

Same model, data and schedule as tests/realruns.py; each builder returns the output folder and
the callback, so tests can read the callback's records.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import realruns


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


def hf_train(out: Path, policy, *, max_steps: int = 60, spike_step: Optional[int] = None,
             spike_scale: float = 4.0, nan_step: Optional[int] = None, best_oldest: bool = False,
             hooks: Optional[dict] = None, resume: Optional[str] = None, extra_callbacks=(), **cb_kwargs):
    """Train the tiny GPT-2 with HFCheckpointStrategy(policy). best_oldest: evaluate at every save
    with greater_is_better=True on eval_loss, so the Trainer's "best" is the *worst* (earliest)
    checkpoint: a best that keep_last would otherwise rotate away."""
    from transformers import Trainer

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    cb = HFCheckpointStrategy(policy, **cb_kwargs)
    for name, fn in (hooks or {}).items():
        setattr(cb.core, name, fn)
    args = realruns._training_args(out, max_steps=max_steps, save_steps=500)
    args.save_total_limit = 3   # turned off by the callback
    args.logging_nan_inf_filter = False   # log a NaN loss as NaN
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
    trainer = Trainer(model=realruns._tiny_gpt2(), args=args, train_dataset=realruns._TokenDataset(4096, 16, 64),
                      eval_dataset=eval_ds, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return cb, trainer


def steps_in(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in Path(out).glob("checkpoint-*"))


def lightning_train(ckpt_dir: Path, policy, *, max_steps: int = 60, spike_step: Optional[int] = None,
                    spike_scale: float = 3.0, nan_step: Optional[int] = None,
                    hooks: Optional[dict] = None, resume: Optional[str] = None, monitor: Optional[str] = None,
                    extra_callbacks=(), save_top_k: int = 1, plugins=None, devices: int = 1, strategy: str = "auto",
                    with_callback: bool = True, save_every: int = 10, default_logger: bool = False,
                    monitor_every: Optional[int] = None, **cb_kwargs):
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
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

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
                        p.add_(torch.randn(p.shape, generator=g) * spike_scale * p.detach().std().nan_to_num(0.05).clamp_min(0.05))
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
    mc = ModelCheckpoint(dirpath=None if default_logger else str(ckpt_dir), save_top_k=save_top_k, monitor=monitor,
                         mode="max" if monitor else "min",
                         every_n_train_steps=monitor_every or (None if with_callback else save_every))
    ours = [cb] if cb is not None else []
    trainer = pl.Trainer(max_steps=max_steps, callbacks=[Spike(), *ours, mc, *extra_callbacks], logger=default_logger,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=devices,
                         strategy=strategy,
                         log_every_n_steps=1, plugins=plugins,
                         default_root_dir=str(ckpt_dir if default_logger else Path(ckpt_dir).parent))
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
        y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1).tanh() + 0.3 * torch.randn(32, 1, generator=g)
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
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, str(path) + ".tmp")
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
    (out / f"result-{rank}.json").write_text(json.dumps({"last": last, **summary}, default=str))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "guard":
        guard_ddp(Path(sys.argv[2]))
