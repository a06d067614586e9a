"""PyTorch Lightning and NeMo (which saves through Lightning): everything the package knows of their checkpoints.

- names: ``*.ckpt`` (a torch zip archive) or a ``*.ckpt/`` folder (sharded strategies); NeMo: a checkpoint with a
  ``<name>-unfinished`` marker beside it, or a folder with ``weights/`` and ``context/`` (formats/identify.py);
- the checkers (`CHECKERS`): a file's archive (``optimizer_states`` -> resumable, ``global_step`` -> the step of
  ``last.ckpt``); a sharded folder's DCP (formats/dcp.py) or DeepSpeed ``checkpoint/`` (formats/deepspeed.py) save;
  NeMo's -unfinished marker is an unfinished save.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from checkpoint_strategy.formats import dcp, deepspeed
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.base import Checker, Ctx, Layout, ls


def _check_lightning(ctx: Ctx, found: fm.Found) -> Layout:
    path = found.path
    out = Layout(step=found.step)
    if os.path.isdir(path):
        names = ls(path)
        if ".metadata" in names or any(n.endswith(".distcp") for n in names):
            dcp.check_dcp_dir(ctx, path, out)
        elif "checkpoint" in names:
            deepspeed.check_deepspeed_dir(ctx, os.path.join(path, "checkpoint"), out)
        else:
            ctx.missing(path, "sharded checkpoint contents (.metadata or checkpoint/)")
        out.sharded, out.portability = True, "lightning-sharded"
        return out
    z = ctx.zip(path, "mixed")
    out.resumable = "optimizer_states" in z.keys()
    out.portability = "full" if out.resumable else "weights"
    out.step = _pickle_step(z) if out.step is None else out.step  # last.ckpt: no step in its name
    return out


def _pickle_step(z: fc.ZipScan) -> int | None:
    """The training step a torch archive records at its pickle's root (Lightning and NeMo: global_step), read
    as data; None when there is none."""
    root = z.pickle.root if z.pickle is not None else None
    step = root.get("global_step") if isinstance(root, dict) else None
    return step if type(step) is int and step >= 0 else None


def _check_nemo(ctx: Ctx, found: fm.Found) -> Layout:
    path = found.path
    out = Layout(step=found.step)
    marker = fm.unfinished_marker(path)
    if os.path.lexists(marker):
        ctx.bad(marker, "NeMo -unfinished marker present: the save did not finish", "incomplete")
    if os.path.isdir(path):
        names = ls(path)
        target = os.path.join(path, "weights") if "weights" in names else path
        dcp.check_dcp_dir(ctx, target, out)
        if "common.pt" in ls(target):
            ctx.zip(os.path.join(target, "common.pt"))
        out.sharded, out.portability = True, "dcp"
    elif os.path.exists(path):
        z = ctx.zip(path, "mixed")
        out.resumable = "optimizer_states" in z.keys()
        out.portability = "full" if out.resumable else "weights"
        out.step = _pickle_step(z) if out.step is None else out.step
    return out


CHECKERS: dict[str, Checker] = {"lightning": _check_lightning, "nemo": _check_nemo}
FOLDER_FORMATS: tuple[str, ...] = ()  # a .ckpt is a file or a folder
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {}
