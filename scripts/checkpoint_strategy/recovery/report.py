"""Render the recovery and verify-resume reports: text/markdown through templates, JSON from the models."""

from __future__ import annotations

from checkpoint_strategy.recovery.models import RecoveryReport, VerifyResumeReport
from checkpoint_strategy.render import render_template, to_json


def render_recovery(report: RecoveryReport, fmt: str = "text") -> str:
    if fmt == "json":
        return to_json(report.model_dump(mode="json"))
    name = "recover.md.j2" if fmt == "markdown" else "recover.txt.j2"
    return render_template(name, r=report)


def render_verify(report: VerifyResumeReport, fmt: str = "text") -> str:
    if fmt == "json":
        return to_json(report.model_dump(mode="json"))
    return render_template("verify-resume.txt.j2", r=report)
