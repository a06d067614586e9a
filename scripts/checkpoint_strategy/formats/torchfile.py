"""Single-file checkpoints: a plain ``torch.save`` archive (``*.pt`` / ``*.pth`` / ``*.bin``) and a safetensors file.

- names: by extension (formats/identify.py; the HF weight and state file names are the HF checker's);
- the checkers (`CHECKERS`): the torch zip archive (its pickle read as data; the optimizer keys of
  `OPTIM_KEYS` make it resumable, a plain ``{name: tensor}`` dict is weights at level deep),
  the safetensors header and data.
"""

from __future__ import annotations

from collections.abc import Callable

from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.base import Checker, Ctx, Layout

#: the top-level keys of a checkpoint dict that hold optimizer state (Lightning "optimizer_states", a plain loop's
#: "optimizer" / "optimizer_state_dict", ...) and those that hold the weights (a state dict under "state_dict",
#: "model", DeepSpeed's "module", ...): the quick level tells resumable from these, deep and convert read by them
OPTIM_KEYS = (
    "optimizer",
    "optimizer_states",
    "optimizer_state_dict",
    "optim",
    "opt_state",
    "optimizer_state",
)


WEIGHT_KEYS = ("state_dict", "model", "module", "model_state_dict", "model_state")


def _check_safetensors_file(ctx: Ctx, found: fm.Found) -> Layout:
    ctx.safetensors(found.path)
    return Layout(step=found.step, portability="weights")


def _check_torch_file(ctx: Ctx, found: fm.Found) -> Layout:
    z = ctx.zip(found.path, "mixed")
    keys = z.keys()
    resumable = any(k in OPTIM_KEYS for k in keys)
    if (
        ctx.deep
        and ctx.sources
        and ctx.sources[-1].zip is z
        and not any(k in WEIGHT_KEYS or k in OPTIM_KEYS for k in keys)
    ):
        ctx.sources[-1].role = "weights"  # a plain state dict {name: tensor}
    return Layout(
        step=found.step, resumable=resumable, portability="full" if resumable else "weights"
    )


CHECKERS: dict[str, Checker] = {"safetensors": _check_safetensors_file, "torch": _check_torch_file}
FOLDER_FORMATS: tuple[str, ...] = ()
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {}
