"""Builders for real checkpoints and logs, made with the real frameworks on CPU.

Used by tests/conftest.py, which builds each once per test session. Kept tiny: a 2-layer
GPT-2 with a 64-token vocabulary trains 200 steps in a few seconds on one core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


@dataclass
class HFRun:
    output_dir: Path          # holds checkpoint-N/ folders written by the real Trainer
    trainer_state: Path       # the newest checkpoint's trainer_state.json
    spike_step: int           # the weights were perturbed at the end of this optimizer step
    save_steps: int
    max_steps: int
    checkpoint_steps: list[int] = field(default_factory=list)


@dataclass
class LightningRun:
    ckpt_dir: Path            # epoch=E-step=N.ckpt files from ModelCheckpoint
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


def build_hf_run(root: Path, *, max_steps: int = 200, save_steps: int = 10, spike_step: int = 120,
                 spike_scale: float = 4.0) -> HFRun:
    """Train a tiny GPT-2 with the real HF Trainer; blow the weights up at `spike_step`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    _seed(0)
    torch.set_num_threads(1)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    dataset = _TokenDataset(4096, 16, 64)

    class Spike(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == spike_step:
                g = torch.Generator().manual_seed(1)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn(p.shape, generator=g) * spike_scale * p.detach().std().clamp_min(0.02))
            return control

    out = root / "hf-run"
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=10,
        logging_steps=1,
        save_steps=save_steps,
        save_strategy="steps",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        max_grad_norm=1.0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[Spike()])
    trainer.train()
    steps = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    return HFRun(output_dir=out, trainer_state=out / f"checkpoint-{steps[-1]}" / "trainer_state.json",
                 spike_step=spike_step, save_steps=save_steps, max_steps=max_steps, checkpoint_steps=steps)


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
    trainer = pl.Trainer(max_steps=max_steps, callbacks=[callback], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1,
                         default_root_dir=str(root / "lightning-root"))
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


def build_safetensors_file(root: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    _seed(0)
    path = root / "weights" / "model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.randn(64, 32), "b": torch.zeros(32), "ids": torch.arange(10)}, str(path))
    return path
