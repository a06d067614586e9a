"""The world size a checkpoint was saved with, from its layout (file names; DeepSpeed's dp_world_size
read as pickle opcodes), and what a move to another GPU count keeps and changes. Nothing is loaded.

- HF Trainer: one ``rng_state_<rank>.pth`` per process (a single ``rng_state.pth``: one process);
  FSDP/DeepSpeed saves inside it are read as below.
- torch.distributed.checkpoint (DCP, FSDP SHARDED_STATE_DICT, torchtitan): ``__<rank>_<n>.distcp``
  files, one set per rank that wrote.
- DeepSpeed ZeRO: ``zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt`` files, and ``dp_world_size`` in
  ``mp_rank_00_model_states.pt`` (formats/deepspeed.py).
- Megatron: ``mp_rank_<tp>[_<pp>]`` folders (tensor x pipeline parallel ranks).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import Optional

from checkpoint_strategy.formats import deepspeed as ds
from checkpoint_strategy.formats.hf import declared_world
from checkpoint_strategy.formats.models import HardwareMove, SavedWorldSize
from checkpoint_strategy.formats.runlog import run_facts

_RNG = re.compile(r"^rng_state_(\d+)\.pth$")
_DISTCP = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_MEGATRON = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?$")
#: every name the patterns above can match starts with one of these (one str.startswith per name, the
#: patterns only on the few that pass: a Trainer folder's nine files cost no regex at all)
_PREFIXES = ("rng_state_", "__", "zero_pp_rank_", "bf16_zero_pp_rank_", "mp_rank_")
MAX_FILES = 100_000


def _files(path: str) -> dict[str, list[str]]:
    """relative folder -> file names, a bounded walk that follows no symlink."""
    out: dict[str, list[str]] = {}
    seen = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out[os.path.relpath(dirpath, path)] = filenames
        seen += len(filenames)
        if seen > MAX_FILES:
            break
    return out


def _span(ranks: set[int]) -> str:
    return f"rank {min(ranks)}" if len(ranks) == 1 else f"ranks {min(ranks)}-{max(ranks)}"


def _deepspeed(path: str, files: dict[str, list[str]]) -> Optional[SavedWorldSize]:
    dp: set[int] = set()
    mp: set[int] = set()
    model_states = None
    for rel, names in files.items():
        for n in names:
            m = ds.zero_shard(n, "optim")
            if m:
                dp.add(m[0])
                mp.add(m[1])
            elif n == ds.MODEL_STATES and model_states is None:
                model_states = os.path.join(path, rel, n)
    if not dp and model_states is None:
        return None
    stage, saved_dp = (
        ds.deepspeed_zero_layout(ds.zip_pickle(model_states) or b"")
        if model_states
        else (None, None)
    )
    if not dp and saved_dp is None:
        return None
    world = saved_dp if saved_dp is not None else len(dp)
    tp = len(mp) or 1
    evidence = (
        f"DeepSpeed dp_world_size {saved_dp} in mp_rank_00_model_states.pt"
        if saved_dp is not None
        else f"DeepSpeed ZeRO optimizer shards of data-parallel {_span(dp)}"
    )
    if dp and saved_dp is not None:
        evidence += f"; ZeRO{'-' + str(stage) if stage else ''} optimizer shards of {_span(dp)}"
    return SavedWorldSize(
        path=path,
        world_size=world * tp,
        data_parallel=world,
        tensor_parallel=tp,
        shards=len(dp) * tp or None,
        evidence=evidence,
        layout="zero",
    )


def saved_world_size(
    path: str, fmt: str, flat_names: Optional[Sequence[str]] = None
) -> Optional[SavedWorldSize]:
    """What the layout of one checkpoint says about the processes that wrote it; None when it does not tell.
    `flat_names`: the validator's listing of the folder when it held only regular files (no walk then)."""
    if flat_names is not None:
        files = {".": [n for n in flat_names if n.startswith(_PREFIXES)]}
        single_rng = "rng_state.pth" in flat_names
        if not files["."]:  # the common case (a Trainer folder of regular files): no pattern to try
            return _single_rng(path) if fmt == "hf-trainer" and single_rng else None
    elif not os.path.isdir(path) or os.path.islink(path):
        return None
    else:
        files = _files(path)
        single_rng = "rng_state.pth" in files.get(".", ())
        # the names a pattern can match (folders keep theirs: a Megatron mp_rank_* folder holds none)
        files = {rel: [n for n in names if n.startswith(_PREFIXES)] for rel, names in files.items()}
    ds = _deepspeed(path, files)
    if ds is not None:
        return ds
    top = files.get(".", [])
    rng = {int(m.group(1)) for n in top if (m := _RNG.match(n))}
    dcp = {int(m.group(1)) for names in files.values() for n in names if (m := _DISTCP.match(n))}
    dcp_files = sum(1 for names in files.values() for n in names if _DISTCP.match(n))
    meg = [m for d in files if (m := _MEGATRON.match(os.path.basename(d)))]
    if meg:
        tp = len({int(m.group(1)) for m in meg})
        pp = len({int(m.group(2)) for m in meg if m.group(2)}) or 1
        return SavedWorldSize(
            path=path,
            world_size=None,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            shards=len(meg),
            layout="megatron",
            evidence=f"{len(meg)} mp_rank_* folders (tensor parallel {tp} x "
            f"pipeline parallel {pp}; data parallel not recorded)",
        )
    if dcp:
        world = max(len(dcp), len(rng))
        evidence = f"DCP shard files {dcp_files} written by {_span(dcp)}"
        if rng:
            evidence += f"; {len(rng)} rng_state_N.pth files"
        return SavedWorldSize(
            path=path,
            world_size=world,
            shards=dcp_files,
            rng_files=len(rng) or None,
            evidence=evidence,
            layout="dcp",
        )
    if rng:
        return SavedWorldSize(
            path=path,
            world_size=len(rng),
            rng_files=len(rng),
            layout="rng",
            evidence=f"{len(rng)} rng_state_N.pth files ({_span(rng)}), one per process",
        )
    return _single_rng(path) if fmt == "hf-trainer" and single_rng else None


def _single_rng(path: str) -> SavedWorldSize:
    return SavedWorldSize(
        path=path,
        world_size=1,
        rng_files=1,
        layout="rng",
        evidence="a single rng_state.pth: saved by one process",
    )


def global_batch_note(facts, world: Optional[int], target: int) -> tuple[list[str], list[str]]:
    """(must stay constant, what to set on `target` GPUs) from the run's batch settings when known."""
    per_device = facts.int("per_device_train_batch_size") or facts.int("train_batch_size")
    accum = facts.int("gradient_accumulation_steps") or (1 if per_device is not None else None)
    keep = [
        "global batch = per-device batch x gradient accumulation x world size: keep it constant, or the LR "
        "schedule (tuned per optimizer step) and the data position (samples seen per step) change"
    ]
    todo: list[str] = []
    if per_device is not None and accum is not None and world is not None:
        g = per_device * accum * world
        keep[0] += f" (saved: {per_device} x {accum} x {world} = {g})"
        if g % target:
            todo.append(
                f"{g} is not divisible by {target} GPUs: the global batch cannot stay exactly {g}; "
                "choose a GPU count that divides it, or rescale the LR and recompute the step count"
            )
        else:
            per_rank = g // target
            todo.append(
                f"on {target} GPUs set per-device batch x gradient accumulation = {per_rank} (e.g. "
                + (
                    f"per-device {per_device}, accumulation {per_rank // per_device})"
                    if per_rank % per_device == 0
                    else f"per-device {per_rank}, accumulation 1)"
                )
            )
    elif world is not None:
        todo.append(
            f"on {target} GPUs set per-device batch x gradient accumulation = (saved global batch) / "
            f"{target}; the saved world size is {world}"
        )
    return keep, todo


def outside_run(path: str, suffix: str) -> str:
    """Where a converted copy of checkpoint `path` goes: beside its run folder, never inside it (validate would
    take a new folder or file there for a checkpoint): run/checkpoint-2000 -> run-checkpoint-2000-dcp."""
    norm = os.path.normpath(path)
    run, name = os.path.split(norm)
    return f"{run}-{name}{suffix}" if run else os.path.join("..", f"{name}{suffix}")


def convert_command(path: str, layout: str, target: Optional[int] = None) -> Optional[str]:
    """The exact `checkpoint-strategy convert` command a move to another GPU count needs for this layout
    (docs/convert.md), or None when it needs none (DCP reshards on load) or the converter does not read it
    (Megatron, Orbax). The output goes beside the run folder, never into it."""
    gpus = f" {target} GPUs" if target else " any number of GPUs"
    if layout == "zero":
        return (
            f"checkpoint-strategy convert {shlex.quote(path)} {shlex.quote(outside_run(path, '-dcp'))} --to dcp "
            f"(consolidated fp32 weights + Adam moments by parameter name; dcp.load reads it on{gpus}); "
            f"--to safetensors for the weights alone"
        )
    return None


def full_copy_command(path: str) -> str:
    """One file of weights and optimizer state from a DCP checkpoint, beside the run folder (optional)."""
    return f"checkpoint-strategy convert {shlex.quote(path)} {shlex.quote(outside_run(path, '-full.pt'))} --to full"


def move_advice(saved: Sequence[SavedWorldSize], target: int, facts) -> HardwareMove:
    """What a move to `target` GPUs keeps constant and changes, for the newest checkpoint that tells."""
    ref = saved[-1] if saved else None
    world = ref.world_size if ref else None
    keep, todo = global_batch_note(facts, world, target)
    changes: list[str] = []
    if ref is not None and ref.rng_files and ref.rng_files != target:
        changes.append(
            f"per-rank RNG files: {ref.rng_files} saved, {target} ranks will run: ranks without a file "
            "start a fresh RNG stream (dropout/sampling differ; not an error)"
        )
    if ref is not None and ref.layout in ("dcp", "zero", "megatron") and ref.shards:
        how = {
            "dcp": "nothing to convert: dcp.load re-shards them to the new world size (one file only if you "
            f"want one, written beside the run folder: {full_copy_command(ref.path)})",
            "zero": f"{convert_command(ref.path, 'zero', target)} before loading on another data-parallel "
            "size (or a DeepSpeed universal checkpoint to resume with DeepSpeed)",
            "megatron": "Megatron-LM tools/checkpoint/convert.py to the new tensor/pipeline parallel sizes",
        }
        what = "shards" if ref.layout == "dcp" else "shards to consolidate"
        changes.append(f"{what}: {ref.shards} {ref.layout} shard files: {how[ref.layout]}")
    if world is not None and world == target:
        changes.append(f"same world size ({target}): shards and RNG files load as saved")
    elif world is None:
        changes.append(
            "the saved world size is not recorded in this layout: check the launch command of the run"
        )
    command = convert_command(ref.path, ref.layout, target) if ref is not None else None
    return HardwareMove(
        target_gpus=target,
        saved_world_size=world,
        keep_constant=keep,
        set_on_target=todo,
        changes=changes,
        convert=command.split(" (", 1)[0] if command else None,
    )


def _declared(results) -> list[SavedWorldSize]:
    """No valid checkpoint tells its world size (a torn save checked alone): the processes the run was launched
    with, as the newest HF checkpoint's training_args.bin records them, never the count of its rank files."""
    for r in sorted(results, key=lambda r: r.step or 0, reverse=True):
        world = (
            declared_world(r.path) if r.format == "hf-trainer" and os.path.isdir(r.path) else None
        )
        if world is not None:
            return [
                SavedWorldSize(
                    path=r.path,
                    world_size=world,
                    layout="rng",
                    evidence=f"training_args.bin records {world} processes (the run's launch)",
                )
            ]
    return []


def annotate_hardware(report, target_gpus: Optional[int] = None, log: Optional[str] = None):
    """Fill report.hardware (every valid checkpoint whose layout tells) and, with target_gpus,
    report.hardware_move (for the newest of them)."""
    for r in report.checkpoints:
        if r.status == "valid":
            seen = r.seen
            found = saved_world_size(
                r.path, r.format, seen.flat_names if seen is not None else None
            )
            if found is not None:
                report.hardware.append(found)
    if target_gpus is not None:
        steps: dict[str, int] = {}
        for (
            r
        ) in report.checkpoints:  # the first result of each path, as a scan per checkpoint found it
            steps.setdefault(r.path, r.step or 0)
        newest = sorted(report.hardware, key=lambda h: steps.get(h.path, 0)) or _declared(
            report.checkpoints
        )
        state = log or next(
            (
                os.path.join(r.path, "trainer_state.json")
                for r in reversed(report.checkpoints)
                if os.path.isfile(os.path.join(r.path, "trainer_state.json"))
            ),
            None,
        )
        report.hardware_move = move_advice(newest, target_gpus, run_facts(state))
    return report
