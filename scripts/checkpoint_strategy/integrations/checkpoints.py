"""The validator, as the integrations use it: which checkpoints are whole, and what they hold.

Everything goes through the public API of `checkpoint_strategy.validate`
(validate_checkpoint / validate_paths). If that package is missing the command exits 2 with a
clear line rather than pretending a checkpoint was checked.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Optional

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.integrations.models import BadCheckpoint, CheckpointRef

_TORCH_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")
_NOT_WEIGHTS = ("optimizer.pt", "scheduler.pt", "training_args.bin", "rng_state.pth", "scaler.pt")
MAX_LISTED = 100_000


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def api():
    """The validator module, or UsageError (exit 2) when it is not installed."""
    try:
        from checkpoint_strategy import validate
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("checkpoint_strategy.validate"):
            raise UsageError(
                "the checkpoint validator (checkpoint_strategy.validate) is not installed: "
                "cannot validate checkpoints; install the full checkpoint-strategy package"
            ) from None
        raise
    return validate


def _names(path: str) -> list[str]:
    if not os.path.isdir(path):
        return [os.path.basename(path)]
    out: list[str] = []
    for _dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out.extend(filenames)
        if len(out) > MAX_LISTED:
            break
    return out


def formats_present(result) -> list[str]:
    """Save formats in a checkpoint, in the plan's vocabulary.

    safetensors      any *.safetensors file
    sharded          per-rank shards (the validator's `sharded`: FSDP, DCP, ZeRO, TP/PP, Orbax)
    full_state_dict  an unsharded checkpoint that can resume training (weights + optimizer state),
                     or an unsharded torch.save weights file (.bin/.pt/.pth/.ckpt)
    """
    names = [n.lower() for n in _names(result.path)]
    out = []
    if any(n.endswith(".safetensors") for n in names):
        out.append("safetensors")
    torch_weights = any(n.endswith(_TORCH_WEIGHTS) and n not in _NOT_WEIGHTS for n in names)
    if not result.sharded and (result.resumable or torch_weights):
        out.append("full_state_dict")
    if result.sharded:
        out.append("sharded")
    return out


def first_problem(result) -> str:
    if result.problems:
        p = result.problems[0]
        more = f" (+{len(result.problems) - 1} more)" if len(result.problems) > 1 else ""
        return f"{p.file}: {p.reason}{more}"
    return f"status {result.status}"


def to_ref(result, validated_at: str) -> CheckpointRef:
    return CheckpointRef(
        path=result.path,
        step=result.step,
        layout=result.format,
        formats=formats_present(result),
        resumable=result.resumable,
        sharded=result.sharded,
        validated_at=validated_at,
        level=result.level,
    )


def scan(
    root: str, level: str = "quick"
) -> tuple[list[CheckpointRef], list[BadCheckpoint], Optional[str]]:
    """Validate every checkpoint under root. Returns (valid newest first, bad ones, note).

    A root with no checkpoint yet is not an error (a run that has not saved): note says so.
    """
    if not os.path.lexists(root):
        raise UsageError(
            f"--checkpoints {root}: no such folder; expected the run's checkpoint folder"
        )
    ck = api()
    validated_at = now_iso()
    try:
        report = ck.validate_paths([root], level=level, progress=False)
    except UsageError as exc:
        if "no checkpoint recognised" in str(exc):
            return [], [], f"no checkpoint found under {root} yet"
        raise
    valid, bad = [], []
    for r in report.checkpoints:
        if r.status == "valid":
            valid.append(to_ref(r, validated_at))
        else:
            bad.append(
                BadCheckpoint(path=r.path, step=r.step, status=r.status, reason=first_problem(r))
            )
    valid.sort(
        key=lambda c: c.path, reverse=True
    )  # newest first; at one step, what a plain resume loads
    valid.sort(key=lambda c: (c.step is None, -(c.step or 0), fm.resume_order(c.path)[0]))
    bad.sort(key=lambda c: (c.step is not None, c.step or 0, c.path), reverse=True)
    return valid, bad, None
