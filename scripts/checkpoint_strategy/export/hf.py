"""Hugging Face Trainer: TrainingArguments keyword arguments (v4 and v5 differ)."""

from __future__ import annotations

from checkpoint_strategy.export import gaps
from checkpoint_strategy.export.common import (
    CALLBACK_HF,
    VersionSpec,
    major,
    milestones_lost_by_window,
    py,
    steps_text,
)
from checkpoint_strategy.export.models import NotExpressible, Setting
from checkpoint_strategy.render import render_template

SPEC = VersionSpec(("transformers",), ("4", "5"), major, "transformers major version")
SOURCES = (
    "transformers 5.x training_args.py (TrainingArguments: save_strategy, save_steps, save_total_limit, "
    "save_only_model, max_steps; no save_safetensors)",
    "transformers 4.x TrainingArguments docs: save_safetensors (default True) writes model.safetensors",
    "transformers trainer_callback.py DefaultFlowCallback: saves when global_step % save_steps == 0 and at "
    "max_steps when save_strategy is 'steps'",
)


def outputs(version: str) -> tuple[str, ...]:
    return ("python",)


def build(report, s, version: str):
    kw: dict = {"save_strategy": "steps", "save_steps": s.every_steps, "max_steps": s.total_steps}
    gaps_: list[NotExpressible] = []
    lost = milestones_lost_by_window(s)
    if lost:
        gaps_.append(
            NotExpressible(
                item="keep_milestone",
                reason=f"save_total_limit keeps only the newest N checkpoints and the Trainer saves only every "
                f"save_steps: milestones {steps_text(lost)} would be deleted or never written",
                instead=f"add {CALLBACK_HF} to Trainer(callbacks=[...]); it saves the milestones and prunes around "
                f"them, so save_total_limit is left unset here. Without the callback, set "
                f"save_total_limit={s.keep_last} and lose those milestones",
            )
        )
    else:
        kw["save_total_limit"] = s.keep_last
    if not s.save_optimizer:
        kw["save_only_model"] = True
    note = (
        "pass with your own output_dir: TrainingArguments(output_dir=..., **checkpoint_kwargs); max_steps is "
        "the plan's total_steps (the Trainer also saves there)"
    )
    if version == "4":
        if "safetensors" in report.policy.save_formats:
            kw["save_safetensors"] = True
    else:
        note += "; v5 always writes model.safetensors (save_safetensors was removed)"
    gaps_ += gaps.common_gaps(report, "hf")
    if s.async_save:
        gaps_.append(
            NotExpressible(
                item="async_save",
                reason="the Trainer writes checkpoints synchronously: training waits for each save",
                instead="re-plan with --no-async so the interval accounts for the blocking save",
            )
        )
    settings = [Setting(name="TrainingArguments", kind="kwargs", values=kw, note=note)]
    if "sharded" in report.policy.save_formats:
        settings.append(fsdp_setting("full_state_dict" in report.policy.save_formats))
    return settings, gaps_, []


def fsdp_setting(also_full: bool) -> Setting:
    """The plan saves sharded checkpoints: with FSDP that is fsdp_config's fsdp_state_dict_type."""
    full = (
        (
            "; the plan also asks for full_state_dict: before moving to other hardware, save one with "
            "fsdp_state_dict_type FULL_STATE_DICT (gathered on rank 0: portable, slower) or consolidate the "
            "shards (torch.distributed.checkpoint.format_utils.dcp_to_torch_save)"
        )
        if also_full
        else ""
    )
    return Setting(
        name="fsdp_config",
        kind="config",
        values={"fsdp_state_dict_type": "SHARDED_STATE_DICT"},
        note="with FSDP: TrainingArguments(fsdp=..., fsdp_config=fsdp_config) (transformers drops the fsdp_ "
        "prefix) or the fsdp_config block of the accelerate config file; SHARDED_STATE_DICT writes one shard "
        "per rank (fast; resumes on the same world size, re-shards through torch.distributed.checkpoint), "
        "FULL_STATE_DICT gathers one file" + full,
    )


def render(export, fmt: str) -> str:
    kwargs = export.settings[0].values
    return render_template(
        "export-hf.py.j2",
        export=export.model_dump(mode="json"),
        kwargs=[(k, py(v)) for k, v in kwargs.items()],
    )
