"""Builders for real checkpoints and logs, made with the real frameworks on CPU.

Used by tests/conftest.py, which builds each once per test session. Kept tiny: a 2-layer
GPT-2 with a 64-token vocabulary trains 200 steps in a few seconds on one core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from cliresult import checkout_env, run_job

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


@dataclass
class HFRun:
    output_dir: Path  # holds checkpoint-N/ folders written by the real Trainer
    trainer_state: Path  # the newest checkpoint's trainer_state.json
    spike_step: int  # the weights were perturbed at the end of this optimizer step
    save_steps: int
    max_steps: int
    checkpoint_steps: list[int] = field(default_factory=list)


@dataclass
class LightningRun:
    ckpt_dir: Path  # epoch=E-step=N.ckpt files from ModelCheckpoint
    ckpt_files: list[Path] = field(default_factory=list)


def _seed(seed: int = 0) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _TokenDataset:
    """A learnable synthetic language: next token = (token + 1) mod vocab, with noise."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        ramp = torch.arange(seq).unsqueeze(0)
        self.data = (start + ramp) % vocab
        noise = torch.rand(n, seq, generator=g) < 0.05
        self.data[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g)

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i):
        ids = self.data[i]
        return {"input_ids": ids, "labels": ids.clone()}


def _tiny_gpt2(n_embd: int = 32, n_layer: int = 2):
    """The seeded 2-layer GPT-2 (64-token vocabulary) every HF run here starts from (bench/bench_pickle.py also
    builds wider and deeper ones)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    _seed(0)
    torch.set_num_threads(1)
    return GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=32, n_embd=n_embd, n_layer=n_layer, n_head=2)
    )


def _training_args(out: Path, *, max_steps: int, save_steps: int, save_strategy: str = "steps"):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=10,
        logging_steps=1,
        save_steps=save_steps,
        save_strategy=save_strategy,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        max_grad_norm=1.0,
    )


def _spike_callback(spike_step: Optional[int], spike_scale: float):
    """Adds seeded noise (spike_scale x each tensor's std) to every weight at the end of `spike_step`."""
    import torch
    from transformers import TrainerCallback

    class Spike(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if spike_step is not None and state.global_step == spike_step:
                g = torch.Generator().manual_seed(1)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(
                            torch.randn(p.shape, generator=g)
                            * spike_scale
                            * p.detach().std().clamp_min(0.02)
                        )
            return control

    return Spike()


class SimulatedCrash(RuntimeError):
    """Raised by the step logger at `crash_step`: the process "dies" before that step's checkpoint."""


def _jsonl_step_log(
    path: Path, *, crash_step: Optional[int] = None, stop_step: Optional[int] = None
):
    """A TrainerCallback appending {"step", "loss", "learning_rate", "grad_norm"} per logged step to `path`
    (JSON lines, the way a user's own metrics logger would). At `crash_step` it raises SimulatedCrash
    right after writing the line (before the Trainer saves that step's checkpoint); at `stop_step` it
    stops training cleanly."""
    import json

    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                rec = {"step": state.global_step, "loss": float(logs["loss"])}
                for key in ("learning_rate", "grad_norm"):
                    if logs.get(key) is not None:
                        rec[key] = float(logs[key])
                with open(path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
            if crash_step is not None and state.global_step == crash_step:
                raise SimulatedCrash(f"simulated crash at step {crash_step}")
            if stop_step is not None and state.global_step >= stop_step:
                control.should_training_stop = True
            return control

    return StepLog()


def build_hf_run(
    root: Path,
    *,
    max_steps: int = 200,
    save_steps: int = 10,
    spike_step: Optional[int] = 120,
    spike_scale: float = 4.0,
    name: str = "hf-run",
) -> HFRun:
    """Train a tiny GPT-2 with the real HF Trainer; perturb the weights at the end of `spike_step`
    (None: no perturbation). spike_scale 4.0 blows the run up for good; 1.5 gives a spike the run
    absorbs by itself. Checkpoints go to root/name/checkpoint-N."""
    from transformers import Trainer

    model = _tiny_gpt2()
    dataset = _TokenDataset(4096, 16, 64)
    out = root / name
    args = _training_args(out, max_steps=max_steps, save_steps=save_steps)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        callbacks=[_spike_callback(spike_step, spike_scale)],
    )
    trainer.train()
    steps = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    return HFRun(
        output_dir=out,
        trainer_state=out / f"checkpoint-{steps[-1]}" / "trainer_state.json",
        spike_step=spike_step,
        save_steps=save_steps,
        max_steps=max_steps,
        checkpoint_steps=steps,
    )


@dataclass
class HFResumes:
    """One spike-free run that crashed after `crash_step`, resumed twice from checkpoint-`resume_step`."""

    base_dir: Path  # the crashed run's checkpoint-N folders (none after crash_step)
    base_log: Path  # its JSON lines log: steps 1..crash_step
    resume_step: int
    crash_step: int
    resumed_until: int  # each resume trains steps resume_step+1..resumed_until
    logs: dict[str, Path] = field(
        default_factory=dict
    )  # kind -> base log + the resume's steps appended
    checkpoints: dict[str, Path] = field(
        default_factory=dict
    )  # kind -> the checkpoint copy it resumed from
    resumed_dirs: dict[str, Path] = field(
        default_factory=dict
    )  # kind -> the resume's own checkpoint-N folders


def build_hf_resumes(
    root: Path,
    *,
    resume_step: int = 100,
    crash_step: int = 110,
    resumed_until: int = 130,
    max_steps: int = 200,
    save_steps: int = 10,
) -> HFResumes:
    """Real HF Trainer resumes of one checkpoint, logged by a TrainerCallback to JSON lines.

    The base run (no spike, same model, data and schedule as build_hf_run) logs every step to
    base.jsonl and crashes after step `crash_step`. Each resume copies checkpoint-`resume_step`,
    copies the log (so it holds steps 1..crash_step, then the resume's own steps from
    resume_step + 1: a restart segment) and calls the real `trainer.train(resume_from_checkpoint=...)`:

    Each resume saves checkpoint-110, -120, -130 into `resumed_dirs[kind]` (what it wrote after the resume).

    normal        the checkpoint as saved.
    no_optimizer  optimizer.pt deleted. The Trainer does not refuse: `_load_optimizer_and_scheduler`
                  only loads when optimizer.pt *and* scheduler.pt exist, so it silently trains on with
                  a fresh AdamW *and* a fresh LR schedule (warm-up from lr 0 again); scheduler.pt is
                  left in place (deleting it changes nothing). Model weights, RNG state, data
                  position and global step are restored as usual.
    """
    import shutil

    from transformers import Trainer

    base_dir = root / "hf-resume-base"
    base_log = root / "base.jsonl"
    trainer = Trainer(
        model=_tiny_gpt2(),
        args=_training_args(base_dir, max_steps=max_steps, save_steps=save_steps),
        train_dataset=_TokenDataset(4096, 16, 64),
        callbacks=[_jsonl_step_log(base_log, crash_step=crash_step)],
    )
    try:
        trainer.train()
    except SimulatedCrash:
        pass
    run = HFResumes(
        base_dir=base_dir,
        base_log=base_log,
        resume_step=resume_step,
        crash_step=crash_step,
        resumed_until=resumed_until,
    )
    for kind in ("normal", "no_optimizer"):
        ckpt = root / kind / f"checkpoint-{resume_step}"
        shutil.copytree(base_dir / f"checkpoint-{resume_step}", ckpt)
        if kind == "no_optimizer":
            (ckpt / "optimizer.pt").unlink()
        log = root / f"{kind}.jsonl"
        shutil.copy2(base_log, log)
        trainer = Trainer(
            model=_tiny_gpt2(),
            args=_training_args(root / kind / "out", max_steps=max_steps, save_steps=save_steps),
            train_dataset=_TokenDataset(4096, 16, 64),
            callbacks=[_jsonl_step_log(log, stop_step=resumed_until)],
        )
        trainer.train(resume_from_checkpoint=str(ckpt))
        run.logs[kind], run.checkpoints[kind], run.resumed_dirs[kind] = (
            log,
            ckpt,
            root / kind / "out",
        )
    return run


@dataclass
class HFRestartedRun:
    """A run that spiked, crashed, and was resumed from its latest checkpoint, appending to one log."""

    output_dir: Path  # checkpoint-N folders of both attempts
    log: Path  # JSON lines: steps 1..crash_step, then resume_step+1..max_steps
    spike_step: int  # first attempt only: weights perturbed at the end of this step
    crash_step: int  # first attempt died right after logging this step
    resume_step: int  # the latest checkpoint before the crash: the second attempt starts here
    max_steps: int
    first_attempt_lines: int  # lines of `log` written by the first attempt


def build_hf_restarted_run(
    root: Path,
    *,
    spike_step: int = 55,
    spike_scale: float = 4.0,
    crash_step: int = 60,
    max_steps: int = 100,
    save_steps: int = 10,
) -> HFRestartedRun:
    """First attempt: spike at `spike_step`, crash after logging `crash_step` (before saving it).
    Second attempt: the real `trainer.train(resume_from_checkpoint=True)` (latest checkpoint, i.e.
    the newest multiple of save_steps before the crash), no spike, to `max_steps`; both attempts
    append to the same JSON lines log, so the steps after the checkpoint appear twice."""
    from transformers import Trainer

    out = root / "hf-restarted"
    log = root / "metrics.jsonl"
    args = _training_args(out, max_steps=max_steps, save_steps=save_steps)
    trainer = Trainer(
        model=_tiny_gpt2(),
        args=args,
        train_dataset=_TokenDataset(4096, 16, 64),
        callbacks=[
            _spike_callback(spike_step, spike_scale),
            _jsonl_step_log(log, crash_step=crash_step),
        ],
    )
    try:
        trainer.train()
    except SimulatedCrash:
        pass
    first_lines = len(log.read_text(encoding="utf-8").splitlines())
    latest = max(
        int(c.name.split("-")[1]) for c in out.glob("checkpoint-*")
    )  # what resume=True picks
    trainer = Trainer(
        model=_tiny_gpt2(),
        args=args,
        train_dataset=_TokenDataset(4096, 16, 64),
        callbacks=[_jsonl_step_log(log)],
    )
    trainer.train(resume_from_checkpoint=True)
    return HFRestartedRun(
        output_dir=out,
        log=log,
        spike_step=spike_step,
        crash_step=crash_step,
        resume_step=latest,
        max_steps=max_steps,
        first_attempt_lines=first_lines,
    )


def build_lightning_run(root: Path, *, max_steps: int = 30, every: int = 10) -> LightningRun:
    """A real Lightning run: ModelCheckpoint writes epoch=E-step=N.ckpt every `every` steps."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint

    _seed(0)
    torch.set_num_threads(1)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, _idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    x = torch.randn(256, 8)
    y = x.sum(dim=1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    ckpt_dir = root / "lightning-ckpts"
    callback = ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=every, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(root / "lightning-root"),
    )
    trainer.fit(Tiny(), loader)
    return LightningRun(ckpt_dir=ckpt_dir, ckpt_files=sorted(ckpt_dir.glob("*.ckpt")))


def build_dcp_checkpoint(root: Path) -> Path:
    """A real torch.distributed.checkpoint folder (.metadata + __0_0.distcp), model + optimizer."""
    import torch
    import torch.distributed.checkpoint as dcp

    _seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    path = root / "dcp" / "step-100"
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    dcp.save(state, checkpoint_id=str(path))
    return path


def build_dcp_sharded(
    root: Path, shards: int = 4, width: int = 64, layers: Optional[int] = None
) -> Path:
    """A real torch.distributed.checkpoint folder with `shards` data files (FileSystemWriter writes one
    file per writer thread: __0_0.distcp .. __0_{shards-1}.distcp): a Sequential of `layers` (default `shards`)
    Linear(width, width) and its AdamW state after one step (also bench/bench_dcp_deep.py's folder)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    _seed(0)
    model = torch.nn.Sequential(
        *(torch.nn.Linear(width, width) for _ in range(shards if layers is None else layers))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    path = root / "dcp-sharded" / "step-100"
    dcp.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict()},
        storage_writer=FileSystemWriter(str(path), thread_count=shards),
    )
    return path


def build_safetensors_file(root: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    _seed(0)
    path = root / "weights" / "model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.randn(64, 32), "b": torch.zeros(32), "ids": torch.arange(10)}, str(path))
    return path


# --------------------------------------------------------------------------- export: real runs with exported settings


@dataclass
class SaveRun:
    folder: Path  # where the framework wrote its checkpoints
    saved: list[int]  # steps the framework saved at, in order
    kept: list[int]  # steps still on disk at the end
    names: list[str] = field(default_factory=list)  # what is on disk at the end


def run_hf_with_kwargs(root: Path, kwargs: dict, model: tuple[int, int] = (32, 2)) -> SaveRun:
    """The tiny GPT-2 trained by the real Trainer with exported TrainingArguments keywords (`model`: its n_embd
    and n_layer)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    saved: list[int] = []

    class Record(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            saved.append(state.global_step)

    out = root / "hf-export"
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        **kwargs,
    )
    trainer = Trainer(
        model=_tiny_gpt2(*model),
        args=args,
        train_dataset=_TokenDataset(512, 16, 64),
        callbacks=[Record()],
    )
    trainer.train()
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    return SaveRun(out, saved, sorted(int(n.split("-")[1]) for n in names), names)


def run_lightning_with_callbacks(
    root: Path, callbacks_factory, max_steps: int, plugins=None
) -> SaveRun:
    """A real Lightning run with the exported ModelCheckpoint callbacks."""
    import re

    import pytorch_lightning as pl
    import torch

    _seed(0)
    torch.set_num_threads(1)
    saved: list[int] = []

    class Record(pl.Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            saved.append(trainer.global_step)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, _idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    x = torch.randn(512, 8)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )
    folder = root / "lightning-export"
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=callbacks_factory(str(folder)) + [Record()],
        logger=False,
        plugins=plugins,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(root / "lightning-export-root"),
    )
    trainer.fit(Tiny(), loader)
    names = sorted(p.name for p in folder.iterdir())
    steps = sorted({int(m.group(1)) for n in names if (m := re.search(r"step=(\d+)", n))})
    return SaveRun(folder, saved, steps, names)


def run_orbax_with_options(root: Path, options, total_steps: int) -> SaveRun:
    """A real Orbax CheckpointManager run on CPU: manager.save at every step, the policies decide."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    folder = root / "orbax-export"
    saved: list[int] = []
    with ocp.CheckpointManager(str(folder), options=options) as manager:
        for step in range(1, total_steps + 1):
            state = {
                "params": {"w": jnp.full((8, 8), float(step))},
                "opt_state": {"mu": jnp.zeros((8, 8))},
            }
            if manager.save(step, args=ocp.args.StandardSave(state)):
                saved.append(step)
        manager.wait_until_finished()
        kept = sorted(manager.all_steps())
    return SaveRun(folder, saved, kept, sorted(p.name for p in folder.iterdir()))


ORBAX_KILLED_SAVE = """
import os, sys
import jax.numpy as jnp
import orbax.checkpoint as ocp
manager = ocp.CheckpointManager(sys.argv[1], options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True))
manager.save(1, args=ocp.args.StandardSave({"w": jnp.ones((64, 64))}))
manager.wait_until_finished()
manager.save(2, args=ocp.args.StandardSave({"w": jnp.ones((3000, 3000))}))
os._exit(0)   # killed while the async save of step 2 is in flight
"""


def build_orbax_killed_save(root: Path) -> Path:
    """An Orbax folder whose step-2 save was cut off: 1/ finished, 2.orbax-checkpoint-tmp/ left behind."""
    import subprocess
    import sys

    folder = root / "orbax-killed"
    subprocess.run(
        [sys.executable, "-c", ORBAX_KILLED_SAVE, str(folder)],
        check=True,
        capture_output=True,
        timeout=300,
        env=checkout_env(),
    )
    return folder


def build_torchtitan_layout(root: Path) -> Path:
    """torchtitan's checkpoint folder written with plain torch.distributed.checkpoint and torchtitan's names:
    step-10/ holds the full training state (model FQNs flattened at the top, plus optimizer, lr_scheduler,
    dataloader, train_state, as torchtitan's CheckpointManager._flattened_model_states_sd writes it);
    step-20/ is the model-only final save (checkpoint.last_save_model_only, the default since 0.2)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    _seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for _ in range(2):
        model(torch.randn(2, 16)).sum().backward()
        opt.step()
        sched.step()
    folder = root / "torchtitan" / "checkpoint"
    full = dict(model.state_dict())
    full["optimizer"] = get_optimizer_state_dict(
        model, opt, options=StateDictOptions(flatten_optimizer_state_dict=True)
    )
    full["lr_scheduler"] = {"lr_scheduler_0": sched.state_dict()}
    full["dataloader"] = {"dp_rank_0": {"sample_idx": 20}}
    full["train_state"] = {"step": torch.tensor(10), "ntokens_seen": torch.tensor(20480)}
    dcp.save(full, checkpoint_id=str(folder / "step-10"))
    dcp.save(dict(model.state_dict()), checkpoint_id=str(folder / "step-20"))
    return folder


# One process: MASTER_PORT 0 has the store bind a free port itself (a port picked by the test and bound seconds later,
# after the imports, could be taken by then). It ends with os._exit once its saves are on disk (as tests/convertruns.py's
# jobs do): no gloo teardown to abort ('terminate called without an active exception').
DEEPSPEED_RUN = """
import os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import torch, deepspeed
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": int(sys.argv[2])},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "checkpoint": {"tag_validation": "Fail", "load_universal": False, "use_node_local_storage": False}}
deepspeed.init_distributed(dist_backend="gloo")
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for step in range(1, 7):
    x = torch.randn(4, 8)
    loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
    engine.backward(loss)
    engine.step()
    if step % 3 == 0:
        engine.save_checkpoint(sys.argv[1], tag=f"global_step{step}")
torch.distributed.barrier(); sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
"""


def build_deepspeed_run(root: Path, stage: int = 1) -> Path:
    """A real DeepSpeed ZeRO run (stage 1 or 2) on CPU (gloo): global_step3/, global_step6/, latest.
    The first engine start on a machine compiles an op (minutes); later runs reuse the build cache."""
    import sys

    folder = root / "deepspeed"
    run_job(
        [sys.executable, "-c", DEEPSPEED_RUN, str(folder), str(stage)],
        "DeepSpeed run",
        clean=folder,
        timeout=1800,
        env=checkout_env(),
    )
    return folder


def build_deepspeed_universal(folder: Path, tag: str = "global_step6") -> Path:
    """DeepSpeed's own ds_to_universal on a real ZeRO-1/2 save: <folder>/<tag>_universal/ (mp_rank_00_model_states.pt,
    zero/optimizer_state.pt, zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt) and <folder>/latest_universal.
    --inject_missing_state adds the universal_checkpoint_info a plain engine does not record (Megatron-DeepSpeed
    passes it as client state)."""
    import subprocess
    import sys

    out = folder / f"{tag}_universal"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(folder / tag),
            "--output_folder",
            str(out),
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
            "--inject_missing_state",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=checkout_env(),
    )
    if proc.returncode != 0 or not (out / "zero").is_dir():
        raise RuntimeError("ds_to_universal failed: " + proc.stderr[-2000:])
    return out


FSDP2_RUN = """
import os, sys
import torch, torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, out, port):
    # the parent's store server already holds the port: no free port picked here and bound later (taken by then)
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, 5):
        model(torch.randn(4, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step % 2 == 0:   # a plain loop's save, in step-N folders
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{out}/step-{step}")
    # the saves are on disk once both ranks meet; then leave without gloo's teardown, which can abort a rank
    # whose work is done ('terminate called without an active exception', CI on this job, after
    # destroy_process_group too)
    dist.barrier()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # binds a free port itself
    mp.spawn(run, args=(2, sys.argv[1], server.port), nprocs=2)
"""


def build_fsdp2_run(root: Path) -> Path:
    """A plain training loop with FSDP2 (fully_shard) on 2 CPU processes (gloo), saving model + optimizer with
    torch.distributed.checkpoint into step-2/ and step-4/ (__0_0.distcp, __1_0.distcp, .metadata)."""
    import sys

    folder = root / "fsdp2"
    script = root / "fsdp2_run.py"  # mp.spawn needs a file its children can import
    script.write_text(FSDP2_RUN)
    run_job(
        [sys.executable, str(script), str(folder)], "FSDP2 run", clean=folder, env=checkout_env()
    )
    return folder


def build_lightning_topk(
    root: Path, score, *, samples: int, max_steps: int, top_name: str, every_name: str
) -> Path:
    """A real Lightning run with two ModelCheckpoints in root/ckpts: top-2 by the monitored `score` (score(step) is
    logged each step; its file names from top_name) and every 5 steps (save_top_k=-1, names from every_name).
    Returns the checkpoint folder."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _idx):
            x, y = batch
            self.log("score", score(self.global_step))
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    ckpts = root / "ckpts"
    x = torch.randn(samples, 4)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2
    )
    top = ModelCheckpoint(
        dirpath=str(ckpts),
        monitor="score",
        mode="max",
        save_top_k=2,
        every_n_train_steps=5,
        filename=top_name,
    )
    every = ModelCheckpoint(
        dirpath=str(ckpts), save_top_k=-1, every_n_train_steps=5, filename=every_name
    )
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=[top, every],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(root),
    )
    trainer.fit(Tiny(), loader)
    return ckpts
