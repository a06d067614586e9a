"""Real resumes whose optimizer state was kept or reset, and a real 2-process -> 1-process resume,
made with the real frameworks on CPU (verify-resume --checkpoints; tests/test_recovery_resume_checks.py).

Each builder writes the checkpoint resumed from and the checkpoints the resumed run saved after it:

- `build_loop_resumes`: a plain torch loop saving with torch.distributed.checkpoint (model, optimizer,
  train_state.step as an int), resumed `intact` (get_state_dict / set_state_dict) and `reset` (model
  weights loaded, a new AdamW: the mistake the issue describes).
- `build_lightning_resumes`: Lightning `fit(ckpt_path=...)`, `intact` and `reset` (the optimizer's state
  cleared in on_train_start: what a re-created AdamW starts from).
- `build_deepspeed_resumes`: DeepSpeed ZeRO-1 `load_checkpoint(load_optimizer_states=...)`.
- `build_hf_world_change`: HF Trainer under torchrun with 2 gloo processes, resumed by 1 process.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cliresult import checkout_env, run_job

TESTS = Path(__file__).resolve().parent
LOOP_LR = 1e-4  # low: the loss barely moves, so only the checkpoints tell a fresh AdamW


@dataclass
class Resumes:
    base: Path  # holds the checkpoint resumed from
    resume_step: int
    until: int  # the resumes train resume_step+1..until
    resumed: dict[str, Path] = field(
        default_factory=dict
    )  # kind -> the folder the resume saved into
    logs: dict[str, Path] = field(default_factory=dict)  # kind -> JSON lines: steps 1..until


def _write_log(path: Path, losses: dict[int, float]) -> None:
    path.write_text(
        "".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in sorted(losses.items())),
        encoding="utf-8",
    )


# --------------------------------------------------------------------------- plain loop + DCP


def _loop_batch(step: int):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(256, 16, generator=g)
    return x, x[:, :4].sum(1, keepdim=True).repeat(1, 4)


def _loop_train(model, opt, first: int, last: int, losses: dict[int, float]) -> None:
    import torch

    for step in range(first, last + 1):
        x, y = _loop_batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = float(loss)


def _loop_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _loop_save(model, opt, step: int, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.save(
        {"model": msd, "optimizer": osd, "train_state": {"step": step}}, checkpoint_id=str(path)
    )


def build_loop_resumes(root: Path, resume_step: int = 30, until: int = 40) -> Resumes:
    """step-30/ from a plain loop (AdamW at LOOP_LR, batches of 256: the loss barely moves and is not noisy),
    then resumed twice to step 40."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    torch.set_num_threads(1)
    base = root / "loop"
    model = _loop_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LOOP_LR)
    losses: dict[int, float] = {}
    _loop_train(model, opt, 1, resume_step, losses)
    _loop_save(model, opt, resume_step, base / f"step-{resume_step}")
    run = Resumes(base=base, resume_step=resume_step, until=until)
    for kind in ("intact", "reset"):
        model = _loop_model()
        opt = torch.optim.AdamW(model.parameters(), lr=LOOP_LR)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "train_state": {"step": 0}}
        if kind == "intact":
            state["optimizer"] = osd
        dcp.load(state, checkpoint_id=str(base / f"step-{resume_step}"))
        if kind == "intact":
            set_state_dict(
                model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        else:
            model.load_state_dict(state["model"])
            opt = torch.optim.AdamW(model.parameters(), lr=LOOP_LR)  # the mistake: a new optimizer
        start = int(state["train_state"]["step"])
        mine = dict(losses)
        _loop_train(model, opt, start + 1, until, mine)
        _loop_save(model, opt, until, root / kind / f"step-{until}")
        run.resumed[kind], run.logs[kind] = root / kind, root / f"loop-{kind}.jsonl"
        _write_log(run.logs[kind], mine)
    return run


# --------------------------------------------------------------------------- Lightning


def build_lightning_resumes(root: Path, resume_step: int = 10, until: int = 20) -> Resumes:
    """A Lightning run saving step=10, resumed with fit(ckpt_path=...) to step 20 twice."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint

    torch.set_num_threads(1)

    class Tiny(pl.LightningModule):
        def __init__(self, reset: bool = False) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.reset = reset
            self.losses: dict[int, float] = {}

        def training_step(self, batch, _idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.losses[self.trainer.global_step + 1] = float(loss)
            return loss

        def on_train_start(self) -> None:
            if (
                self.reset
            ):  # after Lightning restored the checkpoint: start the optimizer from nothing
                self.trainer.optimizers[0].state.clear()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    x = torch.randn(512, 8)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )

    def fit(model, folder: Path, max_steps: int, ckpt_path=None) -> None:
        torch.manual_seed(0)
        trainer = pl.Trainer(
            max_steps=max_steps,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
            default_root_dir=str(root / "pl-root"),
            callbacks=[ModelCheckpoint(dirpath=str(folder), every_n_train_steps=10, save_top_k=-1)],
        )
        trainer.fit(model, loader, ckpt_path=ckpt_path)

    base = root / "pl-base"
    first = Tiny()
    fit(first, base, resume_step)
    ckpt = next(base.glob(f"*step={resume_step}.ckpt"))
    run = Resumes(base=base, resume_step=resume_step, until=until)
    for kind in ("intact", "reset"):
        model = Tiny(reset=kind == "reset")
        fit(model, root / f"pl-{kind}", until, ckpt_path=str(ckpt))
        run.resumed[kind], run.logs[kind] = root / f"pl-{kind}", root / f"pl-{kind}.jsonl"
        _write_log(run.logs[kind], {**first.losses, **model.losses})
    return run


# --------------------------------------------------------------------------- DeepSpeed

# One process: MASTER_PORT 0 has the store bind a free port itself (a port picked by the test and bound seconds later,
# after the imports, could be taken by then). It ends with os._exit once its saves and logs are on disk (as
# tests/convertruns.py's jobs do): no gloo teardown to abort ('terminate called without an active exception').
DEEPSPEED_RESUMES = """
import os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import torch, deepspeed
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
deepspeed.init_distributed(dist_backend="gloo")
def engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
def train(e, first, last, losses):
    for step in range(first, last + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4, 8, generator=g)
        loss = torch.nn.functional.mse_loss(e(x), x.sum(1, keepdim=True))
        e.backward(loss)
        e.step()
        losses.append('{"step": %d, "loss": %r}' % (step, float(loss)))
root = sys.argv[1]
e = engine()
base = []
train(e, 1, 3, base)
e.save_checkpoint(os.path.join(root, "base"), tag="global_step3")
for kind in ("intact", "reset"):
    e = engine()
    e.load_checkpoint(os.path.join(root, "base"), tag="global_step3", load_optimizer_states=kind == "intact",
                      load_lr_scheduler_states=kind == "intact")
    mine = list(base)
    train(e, 4, 6, mine)
    e.save_checkpoint(os.path.join(root, kind), tag="global_step6")
    with open(os.path.join(root, kind + ".jsonl"), "w") as f:
        f.write("\\n".join(mine) + "\\n")
torch.distributed.barrier(); sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
"""


def build_deepspeed_resumes(root: Path) -> Resumes:
    """DeepSpeed ZeRO-1 on CPU: base/global_step3, resumed to global_step6 with and without its optimizer states."""
    folder = root / "ds-resumes"
    run_job(
        [sys.executable, "-c", DEEPSPEED_RESUMES, str(folder)],
        "DeepSpeed resumes",
        clean=folder,
        timeout=1800,
        env=checkout_env(),
    )
    return Resumes(
        base=folder / "base",
        resume_step=3,
        until=6,
        resumed={"intact": folder / "intact", "reset": folder / "reset"},
        logs={"intact": folder / "intact.jsonl", "reset": folder / "reset.jsonl"},
    )


# --------------------------------------------------------------------------- HF Trainer, 2 processes -> 1

HF_DDP = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import realruns
from transformers import Trainer
out, max_steps, resume = Path(sys.argv[2]), int(sys.argv[3]), (sys.argv[4] if len(sys.argv) > 4 else None)
args = realruns._training_args(out, max_steps=max_steps, save_steps=2)
trainer = Trainer(model=realruns._tiny_gpt2(), args=args, train_dataset=realruns._TokenDataset(512, 16, 64))
trainer.train(resume_from_checkpoint=resume)
import torch.distributed as dist
if dist.is_initialized():  # under torchrun: its saves are on disk once both ranks meet; leave without gloo's teardown
    dist.barrier(); sys.stdout.flush(); sys.stderr.flush()
    import os; os._exit(0)
"""


def build_hf_world_change(root: Path) -> Path:
    """HF Trainer (tiny GPT-2, per-device batch 16) under torchrun with 2 gloo processes to step 4 (checkpoint-2,
    -4 with rng_state_0/1.pth), then resumed from checkpoint-4 by one process to step 6 (checkpoint-6): the global
    batch halves from 32 to 16 without a word from the Trainer. Returns the output folder."""
    script = root / "hf_ddp.py"
    script.write_text(HF_DDP, encoding="utf-8")
    out = root / "hf-ddp"
    env = {**checkout_env(), "OMP_NUM_THREADS": "1"}
    runs = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(TESTS),
            str(out),
            "4",
        ],
        [sys.executable, str(script), str(TESTS), str(out), "6", str(out / "checkpoint-4")],
    )
    for argv in runs:
        run_job(
            argv,
            f"{os.path.basename(argv[1])} run",
            clean=out if "--nproc-per-node" in argv else None,
            env=env,
            cwd=str(root),
        )
    return out
