"""Megatron-LM: command-line flags."""

from __future__ import annotations

from checkpoint_strategy.export import gaps
from checkpoint_strategy.export.common import VersionSpec, major, steps_text
from checkpoint_strategy.export.models import NotExpressible, Setting
from checkpoint_strategy.render import render_template

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
SPEC = VersionSpec(("megatron-core",), ("0",), major, "megatron-core major version")
SOURCES = (
    f"NVIDIA/Megatron-LM@{MEGATRON_COMMIT[:10]} (megatron-core 0.20.0) megatron/training/config/training_config.py "
    "CheckpointConfig: save_interval (--save-interval), save_retain_interval, async_save, ckpt_format "
    "(default torch_dist); arguments.py _add_checkpointing_args: --no-save-optim, --no-save-rng",
    f"NVIDIA/Megatron-LM@{MEGATRON_COMMIT[:10]} megatron/training/arguments.py: save_retain_interval must be a "
    "multiple of save_interval; checkpointing.py: with it, each save deletes the previous one unless its "
    "iteration is a multiple of save_retain_interval; training.py saves at the last iteration",
)


def outputs(version: str) -> tuple[str, ...]:
    return ("args",)


def build(report, s, version: str):
    values: dict = {"--save-interval": s.every_steps}
    if s.async_save:
        values["--async-save"] = None
    if not s.save_optimizer:
        values["--no-save-optim"] = None
    note = (
        "add --save DIR; --async-save needs --ckpt-format torch_dist (the default); Megatron also saves "
        "at the last iteration"
    )
    gaps_: list[NotExpressible] = []
    retain = ""
    if s.periodic_milestones and s.periodic_milestones % s.every_steps == 0:
        retain = (
            f" (--save-retain-interval {s.periodic_milestones} would keep the milestones but only the "
            "newest checkpoint between them: a window of 1)"
        )
    gaps_.append(
        NotExpressible(
            item="keep_last",
            reason="Megatron keeps every checkpoint; its only retention flag, --save-retain-interval, deletes each "
            "previous save that is not a multiple of it" + retain,
            instead=f"run 'checkpoint-strategy prune' on the --save folder with the plan's policy (keep_last "
            f"{s.keep_last}, milestones kept): it deletes only after a newer checkpoint validated",
        )
    )
    off_grid = [m for m in s.keep_steps if m % s.every_steps and m != s.total_steps]
    if off_grid:
        gaps_.append(
            NotExpressible(
                item="keep_milestone",
                reason=f"Megatron saves only every --save-interval: milestones {steps_text(off_grid)} are never written",
                instead="choose milestones that are multiples of the interval (re-plan with --milestones), or "
                "trigger an extra save at those iterations",
            )
        )
    gaps_ += gaps.common_gaps(report, "megatron")
    gaps_ += gaps.format_gaps(report, "megatron")
    return [Setting(name="command-line flags", kind="flags", values=values, note=note)], gaps_, []


def flags(values: dict) -> list[str]:
    return [k if v is None else f"{k} {v}" for k, v in values.items()]


def render(export, fmt: str) -> str:
    return render_template(
        "export-args.txt.j2",
        export=export.model_dump(mode="json"),
        flags=flags(export.settings[0].values),
    )
