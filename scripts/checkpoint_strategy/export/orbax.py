"""Orbax: CheckpointManagerOptions with save_decision_policy and preservation_policy.

The deprecated max_to_keep / keep_period / keep_time_interval are not used. A milestone needs a
save rule *and* a keep rule: SpecificStepsPolicy saves it, CustomSteps (or EveryNSteps) keeps it.
"""

from __future__ import annotations

import re

from checkpoint_strategy.export import gaps
from checkpoint_strategy.export.common import VersionSpec, py
from checkpoint_strategy.export.models import NotExpressible, Setting
from checkpoint_strategy.render import render_template


def version_key(version: str) -> str | None:
    """0.11 (from 0.11.13, when CheckpointManager took preservation_policy) or 0.12; None otherwise."""
    m = re.match(r"^\s*v?(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?", version)
    if not m:
        return None
    major_, minor, patch = int(m.group(1)), int(m.group(2)), m.group(3)
    if (major_, minor) == (0, 12):
        return "0.12"
    if (major_, minor) == (0, 11) and (patch is None or int(patch) >= 13):
        return "0.11"
    return None


SPEC = VersionSpec(
    ("orbax-checkpoint",),
    ("0.11", "0.12"),
    version_key,
    "orbax-checkpoint version (0.11 means 0.11.13 or later)",
)
MODULE = "orbax.checkpoint.checkpoint_managers"
SOURCES = (
    "orbax-checkpoint 0.12.8 checkpoint_manager.py CheckpointManagerOptions: save_decision_policy and "
    "preservation_policy override save_interval_steps/save_on_steps and max_to_keep/keep_time_interval/"
    "keep_period (documented as deprecated); enable_async_checkpointing (default True)",
    "orbax-checkpoint 0.12.8 orbax/checkpoint/checkpoint_managers.py exports FixedIntervalPolicy(interval), "
    "SpecificStepsPolicy(steps), AnySavePolicy(policies), LatestN(n), CustomSteps(steps), "
    "EveryNSteps(interval_steps), AnyPreservationPolicy(policies)",
    "google/orbax docs/api_reference checkpoint.save_decision_policy / checkpoint.preservation_policy",
    "google/orbax checkpoint/CHANGELOG.md: SaveDecisionPolicy added in 0.11.1; CheckpointManager uses "
    "preservation_policy since commit 643a95c (2025-04-27), released in 0.11.13 (2025-04-30)",
)


def outputs(version: str) -> tuple[str, ...]:
    return ("python",)


def build(report, s, version: str):
    save = {"FixedIntervalPolicy": {"interval": s.every_steps}}
    if s.extra_save_steps:
        save["SpecificStepsPolicy"] = {"steps": list(s.extra_save_steps)}
    keep: dict = {"LatestN": {"n": s.keep_last}}
    milestones = [m for m in s.keep_steps if m != s.total_steps] or []
    if s.periodic_milestones:
        keep["EveryNSteps"] = {"interval_steps": s.periodic_milestones}
    elif milestones:
        keep["CustomSteps"] = {"steps": milestones}
    values = {
        "save_decision_policy": save,
        "preservation_policy": keep,
        "enable_async_checkpointing": bool(s.async_save),
    }
    note = (
        f"policies from {MODULE}; call manager.save(step, ...) for every step from 1 (the policy decides; "
        "a save at step 0 would be kept by EveryNSteps) and manager.wait_until_finished() before exit"
    )
    gaps_: list[NotExpressible] = []
    if not s.save_optimizer:
        gaps_.append(
            NotExpressible(
                item="save_optimizer: false",
                reason="Orbax saves whatever items the caller passes to manager.save",
                instead="pass only the parameters, e.g. args=ocp.args.Composite(params=ocp.args.StandardSave(params))",
            )
        )
    gaps_ += gaps.common_gaps(report, "orbax")
    gaps_ += gaps.format_gaps(report, "orbax")
    return (
        [Setting(name="CheckpointManagerOptions", kind="kwargs", values=values, note=note)],
        gaps_,
        [],
    )


def _policy(kind: str, values: dict) -> str:
    parts = []
    for cls, args in values.items():
        if cls in ("CustomSteps",):
            parts.append(f"cm.{cls}({py(args['steps'])})")
        else:
            parts.append(f"cm.{cls}(" + ", ".join(f"{k}={py(v)}" for k, v in args.items()) + ")")
    if len(parts) == 1:
        return parts[0]
    wrapper = "AnySavePolicy" if kind == "save" else "AnyPreservationPolicy"
    return f"cm.{wrapper}([" + ", ".join(parts) + "])"


def render(export, fmt: str) -> str:
    v = export.settings[0].values
    return render_template(
        "export-orbax.py.j2",
        export=export.model_dump(mode="json"),
        module=MODULE,
        save_policy=_policy("save", v["save_decision_policy"]),
        keep_policy=_policy("keep", v["preservation_policy"]),
        enable_async=py(v["enable_async_checkpointing"]),
    )
