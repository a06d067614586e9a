"""2-process runs where a preemption signal reaches one rank alone (tests/test_callbacks_preempt_ddp.py).

Run as a program: ``preemptruns.py hf|pl OUT plain|playbook SIGNAL_STEP``. hf: one rank of a torchrun (gloo, CPU)
HF Trainer; pl: a Lightning Trainer(strategy="ddp", devices=2) (gloo, CPU; Lightning starts rank 1 by running this
program again). Both train the playbooks' tiny net (tests/callbackruns.py) for STEPS steps with the callback saving
every SAVE_EVERY steps, ``preemption_signals=("SIGUSR1",)``, through the plain ``trainer.train`` / ``trainer.fit`` or
the playbook (``train_with_recovery`` / ``fit_with_recovery``), resuming from ``last_valid_checkpoint(OUT)``. At the
start of step SIGNAL_STEP (0: never) rank 1 alone sends itself SIGUSR1. Each rank writes OUT/result-<rank>.json:
the steps it trained in this launch (first, last), the global step it ended at, the callback's preemption record
and whether the ranks' coordination broke, then meets the other rank and leaves.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

STEPS, SAVE_EVERY, SIGNAL_STEP = 60, 20, 30
RANK_TIMEOUT = (
    40.0  # a rank waits this long at the callback's meetings (a hang ends in bounded time)
)


def _finish(out: Path, rank: int, doc: dict) -> None:
    """Write OUT/result-<rank>.json, meet, and leave without gloo's C++ teardown (callbackruns._pb_finish)."""
    from callbackruns import _pb_finish

    _pb_finish(out, rank, doc)


def hf_preempt(out: Path, mode: str, signal_step: int) -> None:
    import torch
    from callbackruns import PB_BATCH, _pb_item, _pb_net
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from checkpoint_strategy.callbacks import (
        HFCheckpointStrategy,
        last_valid_checkpoint,
        train_with_recovery,
    )

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    trained: list[int] = []

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 2 * STEPS * PB_BATCH

        def __getitem__(self, i):
            x, y = _pb_item(i)
            return {"x": x, "y": y}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _pb_net()

        def forward(self, x, y):
            return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}

    class Signal(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if rank == 1 and state.global_step + 1 == signal_step:
                os.kill(os.getpid(), signal.SIGUSR1)

        def on_step_end(self, args, state, control, **kwargs):
            trained.append(state.global_step)

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=PB_BATCH,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_steps=SAVE_EVERY,
        report_to=[],
        seed=0,
        dataloader_drop_last=True,
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
    )
    cb = HFCheckpointStrategy(
        {"frequency": f"every_{SAVE_EVERY}_steps", "keep_last": 5},
        handoff_dir=None,
        rank_timeout=RANK_TIMEOUT,
        preemption_signals=("SIGUSR1",),
    )
    tr = Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[cb, Signal()])
    tr._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(tr.train_dataset)
    resume = last_valid_checkpoint(out)
    if mode == "playbook":
        train_with_recovery(tr, resume_from_checkpoint=resume)
    else:
        tr.train(resume_from_checkpoint=resume)
    _finish(out, rank, _doc(trained, tr.state.global_step, cb, resume))


def _doc(trained: list[int], global_step: int, cb, resume) -> dict:
    return {
        "first": trained[0] if trained else None,
        "last": trained[-1] if trained else None,
        "global_step": int(global_step),
        "preempted": cb.preempted,
        "broken": cb.core.ranks.broken,
        "resumed_from": None if resume is None else os.fspath(resume),
    }


def pl_preempt(out: Path, mode: str, signal_step: int) -> None:
    import pytorch_lightning as lightning
    import torch
    from callbackruns import PB_BATCH, pl_data, pl_net, pl_sampler
    from pytorch_lightning.callbacks import ModelCheckpoint

    from checkpoint_strategy.callbacks import (
        LightningCheckpointStrategy,
        fit_with_recovery,
        last_valid_checkpoint,
    )

    torch.set_num_threads(1)
    trained: list[int] = []

    class Signal(lightning.Callback):
        def on_train_batch_start(self, trainer, module, batch, idx):
            if trainer.global_rank == 1 and trainer.global_step + 1 == signal_step:
                os.kill(os.getpid(), signal.SIGUSR1)

        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            trained.append(trainer.global_step)

    cb = LightningCheckpointStrategy(
        {"frequency": f"every_{SAVE_EVERY}_steps", "keep_last": 5},
        handoff_dir=None,
        rank_timeout=RANK_TIMEOUT,
        preemption_signals=("SIGUSR1",),
    )
    mc = ModelCheckpoint(dirpath=str(out), save_top_k=-1, every_n_train_steps=SAVE_EVERY)
    trainer = lightning.Trainer(
        max_steps=STEPS,
        callbacks=[cb, mc, Signal()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        log_every_n_steps=1,
        devices=2,
        strategy="ddp",
        use_distributed_sampler=False,
    )
    model = pl_net()
    loader = torch.utils.data.DataLoader(pl_data(False), batch_size=PB_BATCH, sampler=pl_sampler())
    resume = last_valid_checkpoint(out)
    if mode == "playbook":
        fit_with_recovery(trainer, model, train_dataloaders=loader, ckpt_path=resume)
    else:
        trainer.fit(model, loader, ckpt_path=resume)
    _finish(out, trainer.global_rank, _doc(trained, trainer.global_step, cb, resume))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    run = {"hf": hf_preempt, "pl": pl_preempt}[sys.argv[1]]
    run(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
