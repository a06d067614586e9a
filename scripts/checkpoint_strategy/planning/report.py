"""Render a PlanReport: text and markdown through templates, JSON and YAML from the model."""

from __future__ import annotations

from markupsafe import Markup

from checkpoint_strategy.planning.models import PlanReport
from checkpoint_strategy.render import render_template, to_json


def policy_yaml(report: PlanReport) -> str:
    """The spec's `checkpoint_policy:` block (a template, so the text path needs no YAML library)."""
    return render_template("policy.yaml.j2", policy=report.policy.model_dump(mode="json"))


def render_plan(report: PlanReport, fmt: str) -> str:
    if fmt == "json":
        return to_json(report.model_dump(mode="json"))
    if fmt == "yaml":
        return policy_yaml(report)
    template = "report.md.j2" if fmt == "markdown" else "report.txt.j2"
    return render_template(template, plan=report.model_dump(mode="json"), policy_yaml=Markup(policy_yaml(report)))
