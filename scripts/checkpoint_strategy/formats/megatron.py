"""Megatron-LM: everything the package knows of its checkpoints.

- names: ``iter_NNNNNNN/`` with ``latest_checkpointed_iteration.txt`` beside it (formats/identify.py tells the folder;
  `TRACKERS` reads the tracker: the iteration it names, or 'release');
- the checker (`CHECKERS`): a legacy save's ``mp_rank_XX[_YYY]/model_optim_rng.pt`` (and ``distrib_optim.pt``) per
  tensor/pipeline-parallel rank, or a ``--ckpt-format torch_dist`` save: a DCP folder (formats/dcp.py) with
  ``common.pt`` and ``metadata.json``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from checkpoint_strategy.formats import dcp
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.base import Checker, Ctx, Layout, ls


def _check_megatron(ctx: Ctx, found: fm.Found) -> Layout:
    path = found.path
    out = Layout(step=found.step)
    names = ls(path)
    if ".metadata" in names:  # torch_dist format
        dcp.check_dcp_dir(ctx, path, out)
        if "common.pt" in names:
            ctx.zip(os.path.join(path, "common.pt"))
        if "metadata.json" in names:
            ctx.json(os.path.join(path, "metadata.json"))
        out.sharded, out.portability = True, "dcp"
        return out
    ranks = sorted(
        n for n in names if n.startswith("mp_rank_") and os.path.isdir(os.path.join(path, n))
    )
    if not ranks:
        ctx.missing(
            os.path.join(path, "mp_rank_00"),
            "model-parallel rank folders (mp_rank_XX/model_optim_rng.pt)",
        )
    has_optim = False
    for r in ranks:
        inner = ls(os.path.join(path, r))
        files = [n for n in inner if n.endswith(".pt")]
        if "model_optim_rng.pt" not in inner:
            ctx.missing(os.path.join(path, r, "model_optim_rng.pt"), "model_optim_rng.pt")
        for n in files:
            z = ctx.zip(
                os.path.join(path, r, n),
                "optimizer" if n == "distrib_optim.pt" else "mixed",
                flat=n == "distrib_optim.pt",
            )
            has_optim = has_optim or "optimizer" in z.keys()
        if "distrib_optim.pt" in inner:
            has_optim = True
    out.resumable = has_optim
    out.sharded = len(ranks) > 1
    out.portability = "megatron" if out.sharded else ("full" if has_optim else "weights")
    return out


def _tracked(text: str) -> str | None:
    """The folder latest_checkpointed_iteration.txt names, as Megatron-LM's read_metadata reads its (stripped)
    text: int(text) (iter_NNNNNNN) or 'release' (here: ""); None when it can load nothing from it."""
    try:
        return f"iter_{int(text):07d}"
    except ValueError:
        return "" if text == "release" else None


CHECKERS: dict[str, Checker] = {"megatron": _check_megatron}
FOLDER_FORMATS: tuple[str, ...] = ("megatron",)
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "latest_checkpointed_iteration.txt": ("megatron", _tracked)
}
