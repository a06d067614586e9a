"""torchtitan: the [checkpoint] TOML table (0.1, 0.2) or --checkpoint.* overrides (0.3)."""

from __future__ import annotations

import json

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.export import gaps
from checkpoint_strategy.export.common import (
    VersionSpec,
    major_minor,
    milestones_lost_by_window,
    steps_text,
)
from checkpoint_strategy.export.models import NotExpressible, Setting
from checkpoint_strategy.render import render_template

SPEC = VersionSpec(("torchtitan",), ("0.1", "0.2", "0.3"), major_minor, "torchtitan version")
SOURCES = (
    "pytorch/torchtitan v0.1.0 (f7084fc) torchtitan/config_manager.py class Checkpoint: enable_checkpoint, "
    "last_save_model_weights_only (default False), keep_latest_k, async_mode",
    "pytorch/torchtitan v0.2.0 (29624e3) torchtitan/config/job_config.py class Checkpoint: enable, "
    "last_save_model_only (default True); components/checkpoint.py rejects keep_latest_k == 1 and always saves "
    "at the last step",
    "pytorch/torchtitan 0.3.0rc1 (1fdf90d) components/checkpointer/base.py BaseCheckpointManager.Config (Python "
    "config + tyro CLI: --checkpoint.<field>; dcp.py Config adds async_mode); docs/checkpoint.md",
    "tyro 1.0.17 _arguments.flag_to_inverse: a True-by-default bool field is turned off with "
    "--checkpoint.no-<field>; _strings.swap_delimiters accepts _ and - alike",
)


def outputs(version: str) -> tuple[str, ...]:
    return ("args",) if version == "0.3" else ("toml", "args")


def build(report, s, version: str):
    if s.keep_last < 2:
        raise UsageError(
            f"keep_last {s.keep_last} cannot be exported to torchtitan: it rejects keep_latest_k=1 "
            "(the newest checkpoint may still be in flight); expected --keep-last 2 or more"
        )
    enable = "enable_checkpoint" if version == "0.1" else "enable"
    last_only = "last_save_model_weights_only" if version == "0.1" else "last_save_model_only"
    values = {
        enable: True,
        "interval": s.every_steps,
        "keep_latest_k": s.keep_last,
        last_only: False,
        "async_mode": "async" if s.async_save else "disabled",
    }
    note = (
        f"{last_only} = false: the final step-{s.total_steps} keeps the optimizer and can resume "
        f"({'true is the default since 0.2' if version != '0.1' else 'the 0.1 default'}); "
        "torchtitan always saves at the last step"
    )
    gaps_: list[NotExpressible] = []
    lost = milestones_lost_by_window(s)
    if lost:
        gaps_.append(
            NotExpressible(
                item="keep_milestone",
                reason=f"keep_latest_k deletes every step-N folder in checkpoint.folder except the newest K, and "
                f"saves happen only every interval: milestones {steps_text(lost)} are lost",
                instead="after a milestone is saved, validate it and copy it outside checkpoint.folder (a copy "
                "inside is purged too); or set keep_latest_k = 0 (keep all) and run "
                "'checkpoint-strategy prune' with the plan's policy",
            )
        )
    if not s.save_optimizer:
        gaps_.append(
            NotExpressible(
                item="save_optimizer: false",
                reason="torchtitan saves the full training state at every interval; only the last save can be "
                "model-only",
                instead=f"keep the full saves, or set {last_only} = true for a weights-only final export",
            )
        )
    gaps_ += gaps.common_gaps(report, "torchtitan")
    gaps_ += gaps.format_gaps(report, "torchtitan")
    kind = "flags" if version == "0.3" else "toml"
    name = "--checkpoint.* overrides" if version == "0.3" else "[checkpoint]"
    return [Setting(name=name, kind=kind, values=values, note=note)], gaps_, []


def flags(values: dict) -> list[str]:
    out = []
    for k, v in values.items():
        if v is True:
            out.append(f"--checkpoint.{k}")
        elif v is False:
            out.append(f"--checkpoint.no_{k}")
        else:
            out.append(f"--checkpoint.{k} {v}")
    return out


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a TOML basic string


def render(export, fmt: str) -> str:
    values = export.settings[0].values
    if fmt == "toml":
        return render_template(
            "export-torchtitan.toml.j2",
            export=export.model_dump(mode="json"),
            items=[(k, toml_value(v)) for k, v in values.items()],
        )
    return render_template(
        "export-args.txt.j2", export=export.model_dump(mode="json"), flags=flags(values)
    )
