"""Lightning: ModelCheckpoint arguments (a second ModelCheckpoint for periodic milestones)."""

from __future__ import annotations

from checkpoint_strategy.export import gaps
from checkpoint_strategy.export.common import (
    CALLBACK_LIGHTNING,
    VersionSpec,
    major,
    milestones_lost_by_window,
    py,
    steps_text,
)
from checkpoint_strategy.export.models import NotExpressible, Setting
from checkpoint_strategy.render import render_template

SPEC = VersionSpec(("lightning", "pytorch-lightning"), ("2",), major, "Lightning major version")
SOURCES = (
    "pytorch_lightning 2.6 callbacks/model_checkpoint.py: ModelCheckpoint(dirpath, filename, monitor, save_last, "
    "save_top_k, save_weights_only, mode, every_n_train_steps); save_top_k other than -1, 0, 1 needs a monitor "
    "(monitor='step', mode='max' keeps the newest); on_train_end writes last.ckpt only when nothing was saved",
    "pytorch_lightning 2.6 plugins/io/async_plugin.py: AsyncCheckpointIO (experimental) saves in a thread",
)


def outputs(version: str) -> tuple[str, ...]:
    return ("python",)


def _final_step_gap(s) -> NotExpressible | None:
    """The last step, when it falls off the every_n_train_steps grid."""
    if not s.total_steps % s.every_steps:
        return None
    return NotExpressible(
        item="final step",
        reason=f"ModelCheckpoint saves only every every_n_train_steps; step {s.total_steps} is off the grid "
        "(save_last only copies the newest save)",
        instead=f'after trainer.fit(...), call trainer.save_checkpoint(f"{{dirpath}}/step={s.total_steps}.ckpt"), '
        f"or add {CALLBACK_LIGHTNING}",
    )


def _milestones(s, settings: list, gaps_: list) -> None:
    """Milestones the rolling window would delete: a second callback when they are periodic, else a gap."""
    lost = [m for m in milestones_lost_by_window(s) if m != s.total_steps]
    if lost and s.periodic_milestones:
        ms = {
            "filename": "milestone-{step}",
            "save_top_k": -1,
            "every_n_train_steps": s.periodic_milestones,
        }
        if not s.save_optimizer:
            ms["save_weights_only"] = True
        settings.append(
            Setting(
                name="ModelCheckpoint (milestones)",
                kind="kwargs",
                values=ms,
                note=f"a second callback in the same dirpath: milestone-step=N.ckpt every {s.periodic_milestones} "
                "steps, never deleted (a duplicate write when a milestone is also a rolling save)",
            )
        )
    elif lost:
        gaps_.append(
            NotExpressible(
                item="keep_milestone",
                reason=f"ModelCheckpoint saves on one period; milestones {steps_text(lost)} are not periodic",
                instead=f"add {CALLBACK_LIGHTNING}, which saves and keeps them",
            )
        )


def build(report, s, version: str):
    rolling: dict = {
        "filename": "{step}",
        "monitor": "step",
        "mode": "max",
        "save_top_k": s.keep_last,
        "every_n_train_steps": s.every_steps,
    }
    note = "step=N.ckpt every every_n_train_steps; monitor='step', mode='max' keeps the newest save_top_k"
    final_gap = _final_step_gap(s)
    if not s.save_optimizer:
        rolling["save_weights_only"] = True
    settings = [
        Setting(name="ModelCheckpoint (rolling window)", kind="kwargs", values=rolling, note=note)
    ]
    gaps_: list[NotExpressible] = [final_gap] if final_gap else []
    _milestones(s, settings, gaps_)
    if s.async_save:
        settings.append(
            Setting(
                name="Trainer",
                kind="code",
                values={"plugins": "[AsyncCheckpointIO()]"},
                note="AsyncCheckpointIO (experimental) writes checkpoints in a background thread",
            )
        )
    gaps_ += gaps.common_gaps(report, "lightning")
    gaps_ += gaps.format_gaps(report, "lightning")
    return settings, gaps_, []


def render(export, fmt: str) -> str:
    pkg = "lightning.pytorch" if export.package == "lightning" else "pytorch_lightning"
    callbacks = [
        (
            st.name,
            "rolling" if "rolling" in st.name else "milestones",
            [(k, py(v)) for k, v in st.values.items()],
        )
        for st in export.settings
        if st.name.startswith("ModelCheckpoint")
    ]
    async_plugin = any(st.name == "Trainer" for st in export.settings)
    return render_template(
        "export-lightning.py.j2",
        export=export.model_dump(mode="json"),
        pkg=pkg,
        callbacks=callbacks,
        async_plugin=async_plugin,
    )
