"""Render the simulate and tradeoffs reports: text and markdown through templates, JSON from the model."""

from __future__ import annotations

from checkpoint_strategy.render import render_template, to_json


def render_simulation(report, fmt: str) -> str:
    if fmt == "json":
        return to_json(report.model_dump(mode="json"))
    template = "simulate.md.j2" if fmt == "markdown" else "simulate.txt.j2"
    return render_template(template, sim=report.model_dump(mode="json"))


def render_tradeoffs(report, fmt: str, show_all: bool = False) -> str:
    if fmt == "json":
        return to_json(report.model_dump(mode="json"))
    data = report.model_dump(mode="json")
    rows = [p for p in data["points"] if show_all or p["pareto"] or p["recommended"]]
    template = "tradeoffs.md.j2" if fmt == "markdown" else "tradeoffs.txt.j2"
    return render_template(template, t=data, rows=rows, show_all=show_all)
