"""Builders for checkpoint layouts whose frameworks are not installable here (Orbax, DeepSpeed,
Megatron-LM, NeMo, torchtitan).

Built from each framework's documented file names, not by the framework itself; the files
inside are real torch.save zip archives / real torch.distributed.checkpoint folders / JSON:
  Orbax      <step>/_CHECKPOINT_METADATA, <step>/commit_success.txt (GCS), <step>/default/_METADATA,
             in-flight <step>.orbax-checkpoint-tmp-<ts>/
  DeepSpeed  latest ("global_stepN"), global_stepN/mp_rank_00_model_states.pt,
             global_stepN/{bf16_,}zero_pp_rank_R_mp_rank_00_optim_states.pt, zero_to_fp32.py
  Megatron   latest_checkpointed_iteration.txt, iter_0000500/mp_rank_00/model_optim_rng.pt
  NeMo       <name>.ckpt and the `<name>-unfinished` marker while a save is in flight
  torchtitan checkpoint/step-N/ holding a DCP checkpoint (.metadata + __0_0.distcp) with torchtitan's keys
             (flattened model, optimizer, train_state); tests/realruns.py builds the full key set
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def _tiny_state(seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(16, 8, generator=g), "b": torch.zeros(8)}


def ocdbt_node(payload: bytes, magic: bytes = b"\x0c\xdb\x3a\x2a") -> bytes:
    """An OCDBT node as tensorstore writes one (a manifest by default): magic, 8-byte length of the whole node,
    the payload, CRC-32C of the bytes before it."""
    from checkpoint_strategy.formats.orbax import crc32c

    head = magic + struct.pack("<Q", len(payload) + 16) + payload
    return head + struct.pack("<I", crc32c(head))


def build_orbax(
    root: Path, steps=(100, 200), commit_marker: bool = True, in_flight: int | None = None
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        d = root / str(step)
        (d / "default").mkdir(parents=True)
        (d / "_CHECKPOINT_METADATA").write_text(
            json.dumps(
                {
                    "item_handlers": {"default": "PyTreeCheckpointHandler"},
                    "metrics": {},
                    "init_timestamp_nsecs": 1_700_000_000_000_000_000 + step,
                    "commit_timestamp_nsecs": 1_700_000_000_500_000_000 + step,
                }
            )
        )
        (d / "default" / "_METADATA").write_text(
            json.dumps({"tree_metadata": {"params": {"w": {}}}})
        )
        (d / "default" / "_sharding").write_text(
            json.dumps({"params.w": {"sharding_type": "NamedSharding"}})
        )
        (d / "default" / "manifest.ocdbt").write_bytes(
            ocdbt_node(bytes(range(53)))
        )  # 69 bytes, as before
        (d / "default" / "d").mkdir()
        (d / "default" / "d" / "0a1b2c").write_bytes(bytes(range(256)) * 16)
        if commit_marker:
            (d / "commit_success.txt").write_text(f"Checkpoint commit was successful to {d}")
    if in_flight is not None:
        t = root / f"{in_flight}.orbax-checkpoint-tmp-1700000000"
        (t / "default").mkdir(parents=True)
        (t / "default" / "_METADATA").write_text("{}")
    return root


def build_deepspeed(root: Path, steps=(10, 20), zero_ranks: int = 2, bf16: bool = True) -> Path:
    import torch

    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        d = root / f"global_step{step}"
        d.mkdir()
        torch.save(
            {"module": _tiny_state(step), "global_steps": step, "dp_world_size": zero_ranks},
            d / "mp_rank_00_model_states.pt",
        )
        prefix = "bf16_" if bf16 else ""
        for r in range(zero_ranks):
            torch.save(
                {"optimizer_state_dict": {"state": {0: _tiny_state(r)}}, "ds_version": "0.14.0"},
                d / f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt",
            )
    (root / "latest").write_text(f"global_step{steps[-1]}")
    (root / "zero_to_fp32.py").write_text(
        "# DeepSpeed writes this conversion script beside the checkpoints\n"
    )
    return root


def build_megatron(root: Path, iterations=(500, 1000), tp: int = 1, optimizer: bool = True) -> Path:
    import torch

    root.mkdir(parents=True, exist_ok=True)
    for it in iterations:
        for rank in range(tp):
            d = root / f"iter_{it:07d}" / f"mp_rank_{rank:02d}"
            d.mkdir(parents=True)
            state = {"model": _tiny_state(rank), "iteration": it, "checkpoint_version": 3.0}
            if optimizer:
                state["optimizer"] = {"state": {0: _tiny_state(rank + 1)}}
                state["rng_state"] = [{"random_rng_state": [1, 2, 3]}]
            torch.save(state, d / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(iterations[-1]))
    return root


def build_nemo(root: Path, steps=(100, 200), unfinished: int | None = None) -> Path:
    import torch

    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        name = f"megatron_gpt--val_loss=1.23-step={step}-consumed_samples={step * 8}.0"
        torch.save(
            {
                "state_dict": _tiny_state(step),
                "optimizer_states": [{"state": {}}],
                "global_step": step,
            },
            root / f"{name}.ckpt",
        )
        if unfinished == step:
            (root / f"{name}-unfinished").write_text("")
    return root


def build_torchtitan(root: Path, steps=(10, 20)) -> Path:
    import torch
    import torch.distributed.checkpoint as dcp

    base = root / "checkpoint"
    for step in steps:
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(
            step
        ):  # the optimizer's step counter equals train_state.step, as in torchtitan
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
        # torchtitan's keys: the model flattened to the top level, its TrainState under "train_state"
        state = dict(
            model.state_dict(), optimizer=opt.state_dict(), train_state={"step": torch.tensor(step)}
        )
        dcp.save(state, checkpoint_id=str(base / f"step-{step}"))
    return base
