"""DeepSpeed: the `checkpoint` config block, plus the save cadence the training loop must keep."""

from __future__ import annotations

from checkpoint_strategy.export import gaps
from checkpoint_strategy.export.common import VersionSpec, major, py
from checkpoint_strategy.export.models import NotExpressible, Setting
from checkpoint_strategy.render import render_template

SPEC = VersionSpec(("deepspeed",), ("0",), major, "DeepSpeed major version")
SOURCES = (
    'deepspeed 0.19.8 runtime/constants.py: "checkpoint": {tag_validation: Ignore, Warn or Fail, load_universal, '
    "use_node_local_storage, parallel_write: {pipeline_stage}}",
    "deepspeed 0.19.8 runtime/engine.py DeepSpeedEngine.save_checkpoint(save_dir, tag=None, client_state={}, "
    "save_latest=True): the caller decides when; tag defaults to global_step<N>; writes 'latest'",
)


def outputs(version: str) -> tuple[str, ...]:
    return ("python",)


def build(report, s, version: str):
    config = {"tag_validation": "Fail", "load_universal": False, "use_node_local_storage": False}
    cadence = {
        "every_steps": s.every_steps,
        "also_at_steps": list(s.extra_save_steps),
        "tag": "global_step{step}",
        "save_latest": True,
    }
    settings = [
        Setting(
            name="ds_config['checkpoint']",
            kind="config",
            values=config,
            note="tag_validation Fail: every rank must save under the same tag",
        ),
        Setting(
            name="save cadence",
            kind="code",
            values=cadence,
            note="DeepSpeed has no schedule: call engine.save_checkpoint(save_dir, tag=f'global_step{step}') "
            "on these steps, on every rank",
        ),
    ]
    gaps_ = [
        NotExpressible(
            item="keep_last / keep_milestone",
            reason="DeepSpeed never deletes a checkpoint",
            instead=f"run 'checkpoint-strategy prune' on save_dir with the plan's policy (keep_last {s.keep_last}, "
            "milestones kept): it deletes only after a newer checkpoint validated",
        )
    ]
    if s.async_save:
        gaps_.append(
            NotExpressible(
                item="async_save",
                reason="engine.save_checkpoint writes synchronously by default; DeepSpeed's decoupled/DataStates "
                "checkpoint engines are separate opt-ins",
                instead="re-plan with --no-async, or configure one of those engines and measure its stall",
            )
        )
    if not s.save_optimizer:
        gaps_.append(
            NotExpressible(
                item="save_optimizer: false",
                reason="save_checkpoint always writes the optimizer states",
                instead="for weights only, call engine.save_16bit_model(save_dir)",
            )
        )
    gaps_ += gaps.common_gaps(report, "deepspeed")
    gaps_ += gaps.format_gaps(report, "deepspeed")
    return settings, gaps_, []


def render(export, fmt: str) -> str:
    config, cadence = export.settings[0].values, export.settings[1].values
    return render_template(
        "export-deepspeed.py.j2",
        export=export.model_dump(mode="json"),
        config=[(k, py(v)) for k, v in config.items()],
        every=py(cadence["every_steps"]),
        also=py(sorted(cadence["also_at_steps"])),
    )
