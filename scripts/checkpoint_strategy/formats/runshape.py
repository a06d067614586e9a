"""How many processes and what global batch a checkpoint was trained with, from its own files, and what
a resume on another world size changes. Nothing is loaded (pickles read as opcodes).

- World size: HF ``training_args.bin`` (accelerate's ``distributed_state.num_processes``, the launch's own
  record), else `worldsize.saved_world_size` (HF ``rng_state_<rank>.pth`` files, DCP ``__<rank>_N.distcp``
  ranks, DeepSpeed ``dp_world_size``). Lightning's ``.ckpt`` does not record it.
- Batch: HF ``training_args.bin`` (read as opcodes: ``per_device_train_batch_size``,
  ``gradient_accumulation_steps``; TrainingArguments holds no world size), else ``trainer_state.json``
  ``train_batch_size``; DeepSpeed ``global_samples / global_steps`` (the global batch it counted) and
  ``ds_config`` (``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``). DCP records no batch.

global batch = per-device batch x gradient accumulation x world size. An LR schedule written in
optimizer steps (warm-up, decay) means the same training only while the global batch stays the same;
so does the data position (samples seen = steps x global batch).

`check_resume_shape` is what a training callback calls on resume with its live world size and batch.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from checkpoint_strategy import storage
from checkpoint_strategy.formats import deepspeed as ds
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.hf import hf_args_world_size
from checkpoint_strategy.formats.models import RunShape
from checkpoint_strategy.formats.optstep import TorchArchive
from checkpoint_strategy.formats.worldsize import saved_world_size


def _int(v: Any) -> Optional[int]:
    return v if type(v) is int and v > 0 else None


def _archive_root(path: str) -> Any:
    if not storage.is_regular(path):
        return None
    return TorchArchive(path).root


def _hf_batch(path: str, out: RunShape) -> None:
    args = _archive_root(os.path.join(path, "training_args.bin"))
    declared = hf_args_world_size(
        args
    )  # what the run was launched with, whatever rng files a torn save left
    if declared is not None and (out.world_size is None or "rng_state" in (out.world_from or "")):
        out.world_size, out.world_from = (
            declared,
            "training_args.bin distributed_state.num_processes",
        )
    state = args.state if hasattr(args, "state") else None
    if isinstance(state, dict) and _int(state.get("per_device_train_batch_size")):
        out.per_device_batch = state["per_device_train_batch_size"]
        out.accumulation = _int(state.get("gradient_accumulation_steps")) or 1
        out.batch_from = (
            "training_args.bin per_device_train_batch_size, gradient_accumulation_steps"
        )
        return
    try:
        ts = storage.read_json(
            os.path.join(path, "trainer_state.json"),
            "trainer_state.json",
            allow_nan=True,
            expect=dict,
        )
    except storage.ReadError:
        return
    if _int(ts.get("train_batch_size")):
        out.per_device_batch = ts["train_batch_size"]
        out.batch_from = "trainer_state.json train_batch_size (gradient accumulation not recorded)"


def _deepspeed_batch(folder: str, out: RunShape) -> None:
    names = sorted(os.listdir(folder))
    model = next((n for n in names if ds.model_states(n)), None)
    root = _archive_root(os.path.join(folder, model)) if model else None
    if not isinstance(root, dict):
        return
    dp = _int(root.get("dp_world_size"))
    if dp and out.world_size is None:
        out.world_size, out.world_from = dp, f"{model} dp_world_size"
    cfg = root.get("ds_config")
    cfg = cfg if isinstance(cfg, dict) else {}
    micro, accum = (
        _int(cfg.get("train_micro_batch_size_per_gpu")),
        _int(cfg.get("gradient_accumulation_steps")),
    )
    if out.per_device_batch is None and micro:
        out.per_device_batch, out.accumulation = micro, accum or 1
        out.batch_from = (
            f"{model} ds_config train_micro_batch_size_per_gpu, gradient_accumulation_steps"
        )
    samples, steps = _int(root.get("global_samples")), _int(root.get("global_steps"))
    if samples and steps and samples % steps == 0 and out.global_batch is None:
        out.global_batch = samples // steps
        out.batch_from = f"{model} global_samples / global_steps"


def read_run_shape(path: str, fmt: Optional[str] = None) -> RunShape:
    """World size and batch of one checkpoint; what is not recorded stays None. Never raises on content."""
    if fmt is None:
        found = fm.identify(path)
        fmt = found.format if found is not None else "unknown"
    out = RunShape(path=path)
    try:
        ws = saved_world_size(path, fmt)
        if ws is not None and ws.world_size is not None:
            out.world_size = ws.data_parallel or ws.world_size
            out.world_from = ws.evidence
        if os.path.isdir(path) and not os.path.islink(path):
            if fmt == "hf-trainer":
                _hf_batch(path, out)
            ds = (
                [path]
                if fmt == "deepspeed"
                else [
                    os.path.join(path, n)
                    for n in sorted(os.listdir(path))
                    if re.match(r"^global_step\d+$", n)
                ]
            )
            for folder in ds[:1]:
                _deepspeed_batch(folder, out)
    except (OSError, storage.ReadError):
        pass
    if out.global_batch is None and None not in (
        out.per_device_batch,
        out.accumulation,
        out.world_size,
    ):
        out.global_batch = out.per_device_batch * out.accumulation * out.world_size  # type: ignore[operator]
    return out


def _procs(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def _factors(s: RunShape) -> str:
    if s.per_device_batch is None or s.accumulation is None or s.world_size is None:
        return ""
    return f" ({s.per_device_batch} per device x {s.accumulation} accumulation x {_procs(s.world_size)})"


def keep_schedule(before: RunShape, new_world: int) -> str:
    """What to set on `new_world` processes so the global batch (and so the LR schedule in steps) stays the same."""
    old, pd, acc = before.world_size, before.per_device_batch, before.accumulation
    if old and pd and acc and before.global_batch:
        g = before.global_batch
        if g % new_world:
            return (
                f"The global batch {g} is not divisible by {_procs(new_world)}: it cannot stay the same; "
                "choose a process count that divides it, or rescale the learning rate and step count"
            )
        per_rank = g // new_world
        if per_rank % pd == 0:
            return (
                f"To keep the global batch {g} on {_procs(new_world)} set gradient accumulation to "
                f"{per_rank // pd} (= {acc} x {old}/{new_world}) with per-device batch {pd}, or per-device "
                f"batch x accumulation = {per_rank}"
            )
        return f"To keep the global batch {g} on {_procs(new_world)} set per-device batch x accumulation = {per_rank}"
    if old:
        return (
            f"To keep the global batch, scale gradient accumulation (or the per-device batch) by {old}/{new_world} "
            "(old world size / new)"
        )
    return "Keep per-device batch x gradient accumulation x world size the same as the saved run's"


def shape_change(before: RunShape, after: RunShape) -> tuple[list[str], bool]:
    """(lines, global batch changed) comparing the checkpoint resumed from with the resumed run."""
    w0, w1, g0, g1 = before.world_size, after.world_size, before.global_batch, after.global_batch
    if g0 is not None and g1 is not None and g0 != g1:
        advice = (
            keep_schedule(before, w1)
            if w1 is not None
            else f"Keep per-device batch x gradient accumulation x world size = {g0}"
        )
        return [
            f"global batch changed at the resume: {g0}{_factors(before)} -> {g1}{_factors(after)}; the LR "
            f"schedule (in optimizer steps) now sees {g1 / g0:.3g}x the samples per step and the data position "
            f"moves {g1 / g0:.3g}x as fast. {advice}"
        ], True
    if w0 is None or w1 is None or w0 == w1:
        return [], False
    if g0 is not None and g0 == g1:
        return [
            f"world size changed at the resume ({w0} -> {_procs(w1)}) with the global batch kept at {g0}: "
            "the LR schedule in steps is unchanged"
        ], False
    return [
        f"world size changed at the resume: {w0} -> {_procs(w1)}; unless per-device batch x gradient "
        f"accumulation was scaled by {w0}/{w1}, the global batch changed by {w1}/{w0} and the LR schedule in "
        f"steps no longer means the same training. {keep_schedule(before, w1)}"
    ], False


def check_resume_shape(
    checkpoint: str,
    *,
    world_size: int,
    per_device_batch: Optional[int] = None,
    accumulation: Optional[int] = None,
) -> list[str]:
    """For a training callback at resume time: warnings when the live world size or global batch differs from
    what `checkpoint` was saved with (empty: same, or the checkpoint does not record it). Never raises on the
    checkpoint's content; bad arguments raise ValueError."""
    for name, v in (
        ("world_size", world_size),
        ("per_device_batch", per_device_batch),
        ("accumulation", accumulation),
    ):
        if v is not None and (type(v) is not int or v < 1):
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    before = read_run_shape(checkpoint)
    pd = per_device_batch if per_device_batch is not None else before.per_device_batch
    acc = (
        accumulation
        if accumulation is not None
        else (before.accumulation if per_device_batch is None else 1)
    )
    after = RunShape(
        path="(this run)",
        world_size=world_size,
        per_device_batch=pd,
        accumulation=acc,
        global_batch=pd * acc * world_size if pd and acc else None,
    )
    return shape_change(before, after)[0]
