"""Shared by every exporter: the plan's schedule in steps, the framework version, the plan file."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Optional

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.export.models import Schedule
from checkpoint_strategy.planning.models import MAX_STEPS, PlanReport
from checkpoint_strategy.planning.planfile import report_from_data
from checkpoint_strategy.planning.planner import saved_steps_tail

MAX_KEEP_LAST = 100000  # the plan's own bound on --keep-last
MAX_MILESTONES = 100000  # a plan file with more milestones than this is not a plan

CALLBACK_HF = "checkpoint_strategy.callbacks.HFCheckpointStrategy"
CALLBACK_LIGHTNING = "checkpoint_strategy.callbacks.LightningCheckpointStrategy"
VALIDATE_API = "checkpoint_strategy.validate.validate_checkpoint(path)"


# --------------------------------------------------------------------------- schedule


def schedule_of(report: PlanReport) -> Schedule:
    """The plan in steps. Bad numbers in a hand-edited plan file are bad input (exit 2)."""
    total, every, keep = report.total_steps, report.frequency_steps, report.keep_last
    if not 1 <= total <= MAX_STEPS:
        raise UsageError(
            f"plan: total_steps {total} is out of range: expected 1 to {MAX_STEPS:.0e}"
        )
    if not 1 <= every <= total:
        raise UsageError(
            f"plan: frequency_steps {every} is out of range: expected 1 to total_steps {total}"
        )
    if not 1 <= keep <= MAX_KEEP_LAST:
        raise UsageError(f"plan: keep_last {keep} is out of range: expected 1 to {MAX_KEEP_LAST}")
    milestones = report.milestone_steps
    if len(milestones) > MAX_MILESTONES:
        raise UsageError(
            f"plan: {len(milestones)} milestone steps: expected at most {MAX_MILESTONES}"
        )
    bad = [m for m in milestones if not 1 <= m <= total]
    if bad:
        raise UsageError(
            f"plan: milestone step {bad[0]} is outside the run: expected 1 to total_steps {total}"
        )
    milestones = sorted(set(milestones))
    extra = sorted({m for m in milestones if m % every} | ({total} if total % every else set()))
    return Schedule(
        total_steps=total,
        every_steps=every,
        extra_save_steps=extra,
        keep_last=keep,
        keep_steps=milestones,
        periodic_milestones=periodic(milestones, total),
        save_optimizer=report.policy.save_optimizer,
        async_save=report.policy.async_save,
    )


def periodic(milestones: list[int], total: int) -> Optional[int]:
    """P when the milestones other than the final step are exactly P, 2P, 3P, ... (up to total)."""
    ms = [m for m in milestones if m != total]
    if not ms:
        return None
    p = ms[0]
    count = total // p - (1 if total % p == 0 else 0)
    if len(ms) != count:
        return None
    return p if all(m == p * (i + 1) for i, m in enumerate(ms)) else None


def grid_saves(s: Schedule) -> list[int]:
    """Every step the plan saves at (multiples of every_steps, off-grid milestones, the final step).

    For tests and small runs: the list has total_steps / every_steps entries."""
    return sorted(
        set(range(s.every_steps, s.total_steps + 1, s.every_steps)) | set(s.extra_save_steps)
    )


def final_window(s: Schedule) -> list[int]:
    """The newest keep_last saves at the end of the run, counted as the plan counts them (the grid and
    the final step; off-grid milestones are extra saves on top)."""
    return saved_steps_tail(s.total_steps, s.every_steps, s.keep_last)


def kept_at_end(s: Schedule) -> list[int]:
    """The steps still on disk when the run ends: the final window plus every milestone."""
    return sorted(set(final_window(s)) | set(s.keep_steps))


def milestones_lost_by_window(s: Schedule) -> list[int]:
    """Milestones a plain keep-the-newest-N rotation deletes (or never saves, when off the grid)."""
    window = set(final_window(s))
    return [m for m in s.keep_steps if m not in window]


def steps_text(steps: list[int], limit: int = 8) -> str:
    if not steps:
        return "none"
    shown = ", ".join(str(x) for x in steps[:limit])
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > limit else "")


# --------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class VersionSpec:
    """Which distributions carry the framework and which versions the exporter knows."""

    packages: tuple[str, ...]
    known: tuple[str, ...]  # oldest first; the last is "newest known"
    key_of: Callable[[str], Optional[str]]
    what: str  # how a version is spelled, for messages


@dataclass
class Resolved:
    key: str
    package: str
    source: str
    note: str
    warnings: list[str] = field(default_factory=list)


_SAFE_VERSION = re.compile(r"v?[0-9][0-9A-Za-z.+_-]{0,39}")
_VERSION = re.compile(r"^\s*v?(\d{1,6})(?:\.(\d{1,6}))?")


def major(version: str) -> Optional[str]:
    m = _VERSION.match(version)
    return m.group(1) if m else None


def major_minor(version: str) -> Optional[str]:
    m = _VERSION.match(version)
    if not m:
        return None
    return f"{int(m.group(1))}.{int(m.group(2) or 0)}"


def installed_version(packages: tuple[str, ...]) -> tuple[Optional[str], Optional[str]]:
    """(distribution, version) of the first installed package, read from its metadata only."""
    for dist in packages:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - broken metadata counts as not installed
            continue
    return None, None


def resolve_version(framework: str, spec: VersionSpec, given: Optional[str]) -> Resolved:
    """--framework-version wins; else the installed version; else the newest known. Says which."""
    dist, inst = installed_version(spec.packages)
    if inst is not None and not _SAFE_VERSION.fullmatch(inst):
        inst = None  # odd metadata: not trusted into messages or emitted code
    known = ", ".join(spec.known)
    if given is not None:
        if not _SAFE_VERSION.fullmatch(str(given)):
            raise UsageError(
                f"--framework-version {str(given)[:40]!r} is not a version number: expected "
                f"{spec.what} {known}, e.g. {spec.known[-1]}"
            )
        key = spec.key_of(str(given))
        if key is None or key not in spec.known:
            raise UsageError(
                f"--framework-version {given!r} is not a {framework} version this exporter knows: "
                f"expected {spec.what} {known}"
            )
        warnings = []
        if inst is not None and spec.key_of(inst) != key:
            warnings.append(
                f"{dist} {inst} is installed here, but the settings are written for {key} "
                "as --framework-version asked"
            )
        return Resolved(
            key,
            dist or spec.packages[0],
            "--framework-version",
            f"written for {spec.packages[0]} {key} (--framework-version {given})",
            warnings,
        )
    if inst is not None:
        assert dist is not None, "installed_version names the distribution it read"
        key = spec.key_of(inst)
        if key in spec.known:
            return Resolved(
                key, dist, "installed", f"written for {dist} {key} (installed here: {inst})"
            )
        newest = spec.known[-1]
        return Resolved(
            newest,
            dist,
            "newest known",
            f"written for {dist} {newest}, the newest known ({dist} {inst} is installed but not "
            f"a version this exporter knows)",
            [
                f"{dist} {inst} is not a known version ({known}): the option names were checked "
                f"against {newest}; verify them, or pass --framework-version"
            ],
        )
    newest = spec.known[-1]
    return Resolved(
        newest,
        spec.packages[0],
        "newest known",
        f"written for {spec.packages[0]} {newest}, the newest known ({' / '.join(spec.packages)} "
        "is not installed here; pass --framework-version to choose)",
    )


# --------------------------------------------------------------------------- plan file


def load_plan_file(path: str) -> PlanReport:
    """The JSON `plan --format json` prints (a file, or '-' for stdin), checked against plan.schema.json."""
    raw, name = storage.read_input(path, "plan file")  # a regular file or '-' for stdin, bounded
    return report_from_data(storage.loads_json(raw, f"plan file {name}", expect=dict), name)


def py(value) -> str:
    """A Python literal for a plain value (str, int, float, bool, None, list, dict)."""
    return repr(value)
