"""Export a plan to one framework's own checkpoint settings (`checkpoint-strategy export`).

One module per framework turns a PlanReport into native settings plus the list of what the
framework cannot hold ("not expressible", each with what to do instead). Nothing here imports
a framework: the version is read from the installed package's metadata only.

    from checkpoint_strategy.export import export_plan, render_export
    report = export_plan(plan_report, "orbax")          # ExportReport
    print(render_export(report, "python"))
"""

from __future__ import annotations

import importlib
from typing import Optional

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.export.common import resolve_version, schedule_of
from checkpoint_strategy.export.models import ExportReport
from checkpoint_strategy.planning.models import PlanReport
from checkpoint_strategy.render import render_template, to_json

FRAMEWORKS = ("hf", "lightning", "orbax", "torchtitan", "megatron", "deepspeed")
OUTPUTS = ("text", "json", "python", "toml", "args")


def _module(framework: str):
    if framework not in FRAMEWORKS:
        raise UsageError(
            f"unknown framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}"
        )
    return importlib.import_module(f"checkpoint_strategy.export.{framework}")


def export_plan(report: PlanReport, framework: str, version: Optional[str] = None) -> ExportReport:
    """The plan as `framework`'s settings, for `version` (else the installed one, else the newest known)."""
    mod = _module(framework)
    schedule = schedule_of(report)
    resolved = resolve_version(framework, mod.SPEC, version)
    settings, gaps, warnings = mod.build(report, schedule, resolved.key)
    return ExportReport(
        framework=framework,
        package=resolved.package,
        framework_version=resolved.key,
        version_source=resolved.source,
        version_note=resolved.note,
        schedule=schedule,
        settings=settings,
        not_expressible=gaps,
        warnings=resolved.warnings + warnings,
        sources=list(mod.SOURCES),
    )


def formats_for(export: ExportReport) -> tuple[str, ...]:
    return ("text", "json") + tuple(_module(export.framework).outputs(export.framework_version))


def render_export(export: ExportReport, fmt: str) -> str:
    allowed = formats_for(export)
    if fmt not in allowed:
        raise UsageError(
            f"--format {fmt} is not available for {export.framework} "
            f"{export.framework_version}: expected one of {', '.join(allowed)}"
        )
    if fmt == "json":
        return to_json(export.model_dump(mode="json"))
    if fmt == "text":
        return render_template("export.txt.j2", export=export.model_dump(mode="json"))
    return _module(export.framework).render(export, fmt)


__all__ = ["FRAMEWORKS", "OUTPUTS", "export_plan", "render_export", "formats_for"]
