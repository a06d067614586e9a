"""Keep rules: which checkpoints a retention policy keeps, decided without touching any file.

The one decision shared by `prune` (local folders), the training callbacks and a prune over
object storage: each caller describes what it sees as `Candidate`s, calls `plan_prune`, and
deletes the `Decision`s marked "delete" its own way (`prune.apply_prune` renames then removes).

Public API::

    from checkpoint_strategy.retention.rules import Candidate, Retention, plan_prune, classify_name

    m = classify_name("checkpoint-500")            # NameMatch(layout="hf-trainer", step=500, ...)
    c = Candidate(name="checkpoint-500", step=500, layout=m.layout, status="valid", resumable=True)
    plan = plan_prune([c, ...], Retention(keep_last=3, milestones=frozenset({1000})))
    for d in plan.decisions:
        d.action        # "keep" | "delete"
        d.reasons       # [Reason(kind, text)], kinds from formats.reasonkinds.REASON_KINDS
        d.justified_by  # for a delete: the newer validated checkpoint that makes it safe

A keep rule is ``rule(candidate, context) -> Reason | None`` (like Orbax's preservation
policies): it returns why the candidate must stay, or None. A candidate is deleted only when no
rule keeps it and a newer validated checkpoint stands in for it. ``SAFETY_RULES`` (unrecognised,
final export, symlinked, symlink target, not valid, no step, resume pointer, in flight) always
run; ``rules`` (default ``Retention.rules()``: ``AnyOf(KeepNewest(), KeepLast(n), KeepMilestones(steps),
KeepBest(names), KeepNamed("rollback", ...), KeepNamed("pre_spike", ...), KeepPostOnset(names, n))``)
compose and can be extended, e.g. ``plan_prune(cs, r, rules=AnyOf(*r.rules().rules, my_rule))``.

Invariants (tested on generated folders):
- keep_last counts *resumable* valid checkpoints when the run has any, else valid ones (one per step); the
  newest of them is always kept; a weights-only checkpoint never justifies deleting a
  resumable one;
- a name that does not exactly match a known layout's pattern is never deleted;
- a symlinked checkpoint (or one resolving outside ROOT) is never deleted and never counts as
  the newer checkpoint that justifies a deletion; a checkpoint a symlink inside ROOT resolves to
  (`best -> checkpoint-90`, Lightning's `last.ckpt` link) is kept with the link named;
- the checkpoint the framework's resume pointer names (DeepSpeed `latest`) is kept; newer ones of
  that layout are in flight: kept, never counted, never justify a deletion;
- invalid and incomplete checkpoints never justify a deletion; one is deleted only with
  ``Retention.delete_invalid`` and only when a newer valid checkpoint exists (it is not a save in flight:
  the newest entry, a writer's tmp name and what the resume pointer leaves newer always are), justified
  by the newest counted checkpoint, and never when another rule keeps it (a milestone, the trainer's best);
- milestones, the trainer's best and the rollback point of an unrecovered loss spike are kept;
- checkpoints saved after the onset of an unrecovered spike (`Retention.post_onset`) are kept but
  never counted: keep_last counts the checkpoints safe to resume from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from checkpoint_strategy.formats.reasonkinds import ReasonKind

Status = Literal["valid", "invalid", "incomplete"] | None


# --------------------------------------------------------------------------- names


@dataclass(frozen=True)
class NameMatch:
    """A name that exactly matches a known layout's pattern."""

    layout: str  # hf-trainer, deepspeed, megatron, torchtitan, orbax, lightning
    step: int | None
    metrics: tuple[str, ...] = ()  # Lightning: metric keys in the name (top-k by that metric)
    template: str | None = None  # Lightning: the filename template, e.g. "epoch={}-step={}"
    in_flight: bool = False  # tmp-checkpoint-N / Orbax tmp folder


_PATTERNS: tuple[tuple[re.Pattern[str], str, bool], ...] = (
    (re.compile(r"^checkpoint-([0-9]+)$"), "hf-trainer", False),
    (re.compile(r"^tmp-checkpoint-([0-9]+)$"), "hf-trainer", True),
    (re.compile(r"^global_step([0-9]+)$"), "deepspeed", False),
    (re.compile(r"^iter_([0-9]{7})$"), "megatron", False),
    (re.compile(r"^step-([0-9]+)$"), "torchtitan", False),
    (re.compile(r"^([0-9]+)$"), "orbax", False),
    (re.compile(r"^([0-9]+)\.orbax-checkpoint-tmp(?:-[0-9]+)?$"), "orbax", True),
)
# Lightning ModelCheckpoint names with auto_insert_metric_name: "{key}={value}" joined by "-",
# optional "-v<N>" when a name repeats; save_last writes last.ckpt / last-v<N>.ckpt.
_PL_NUMBER = r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|-?inf|nan"
_PL_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)=(" + _PL_NUMBER + r")(?=-|\Z)")
_PL_VERSION = re.compile(r"-v([0-9]+)\Z")
_PL_LAST = re.compile(r"^last(?:-v[0-9]+)?\.ckpt$")
_INT = re.compile(r"^[0-9]+$")
_ORDER_KEYS = ("epoch", "step")


def _lightning(name: str) -> NameMatch | None:
    if _PL_LAST.fullmatch(name):
        return NameMatch("lightning", None, template="last")
    if not name.endswith(".ckpt"):
        return None
    body = _PL_VERSION.sub("", name[: -len(".ckpt")])
    keys: list[str] = []
    values: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        m = _PL_PART.match(body, pos)
        if m is None or m.group(1) in values:
            return None
        keys.append(m.group(1))
        values[m.group(1)] = m.group(2)
        pos = m.end()
        if pos < len(body):
            if body[pos] != "-":
                return None
            pos += 1
            if pos == len(body):
                return None
    if not keys or any(k in values and not _INT.match(values[k]) for k in _ORDER_KEYS):
        return None
    step = int(values["step"]) if "step" in values else None
    metrics = tuple(k for k in keys if k not in _ORDER_KEYS)
    return NameMatch("lightning", step, metrics, "-".join(f"{k}={{}}" for k in keys))


def classify_name(name: str) -> NameMatch | None:
    """The layout a name exactly matches, or None ("not recognised: kept").

    Recognised: checkpoint-<int>, tmp-checkpoint-<int> (in flight), global_step<int>,
    iter_<7 digits>, step-<int>, Orbax integer folders <int> (and <int>.orbax-checkpoint-tmp-*),
    and Lightning ModelCheckpoint names (key=value parts joined by '-', e.g.
    epoch=0-step=10.ckpt, epoch=0-step=10-val_loss=0.123.ckpt, last.ckpt). Anything else -
    checkpoint-50-KEEP, 'checkpoint-100 (copy)', best-checkpoint-100.bak, model-step=50.safetensors
    - is None.
    """
    for rx, layout, in_flight in _PATTERNS:
        m = rx.fullmatch(name)  # never match(): "$" also matches before a trailing newline
        if m:
            return NameMatch(layout, int(m.group(1)), in_flight=in_flight)
    return _lightning(name)


# --------------------------------------------------------------------------- candidates and rules


@dataclass(frozen=True)
class Candidate:
    """One entry of the checkpoint folder as the keep rules see it.

    name:      the entry's name under ROOT (unique within one plan)
    step:      training step (None when unknown)
    layout:    classify_name(name).layout, None when the name is not recognised
    status:    the validator's verdict; None when not validated (never deleted)
    resumable: optimizer state present; None when unknown
    symlink:   a symlink, or resolves outside ROOT
    links_to:  a symlink inside ROOT: the name of the ROOT entry it resolves into (kept as its target)
    links_into: symlinks inside this entry (a file or folder of it) that resolve into another ROOT
               entry: (that entry's name, the link's path under ROOT); each target is kept
    outside:   resolves outside ROOT (reported, never followed, never deleted)
    metrics:   Lightning metric keys in the name (the trainer's top-k by that metric)
    final_export: the run folder's own top-level model files (never deleted)
    """

    name: str
    step: int | None = None
    layout: str | None = None
    status: Status = None
    resumable: bool | None = None
    symlink: bool = False
    metrics: tuple[str, ...] = ()
    final_export: bool = False
    format: str = "unknown"
    path: str = ""
    links_to: str | None = None
    outside: bool = False
    links_into: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Retention:
    """What to keep.

    keep_last:  how many of the newest resumable (else valid) checkpoints to keep, >= 1
    milestones: steps never deleted
    best:       name -> why the trainer calls it best (HF best_model_checkpoint, Lightning top-k)
    rollback:   name of the checkpoint to resume from before an unrecovered loss spike
    rollback_why: text for that reason
    pre_spike:  name -> why: the newest checkpoint before each loss spike of the log (kept)
    post_onset: name -> why: saved after the onset of an unrecovered spike (retention/safety.py):
                never counted by keep_last, never the newest, never justifies a deletion; kept
    latest:     name the framework's resume pointer names (DeepSpeed's `latest` file): kept; a newer
                checkpoint of the same layout is in flight (a save other ranks may still be writing):
                kept, never counted, never justifies a deletion, until the pointer moves
    latest_why: text for that reason
    delete_invalid: an invalid or incomplete checkpoint older than a newer valid one (not a save in flight:
                only the newest entry, a tmp name or what the resume pointer leaves newer is) may be deleted,
                justified by the newest counted checkpoint; default False: kept, its reason says this option
                removes it
    """

    keep_last: int
    milestones: frozenset[int] = frozenset()
    best: Mapping[str, str] = field(default_factory=dict)
    rollback: str | None = None
    rollback_why: str = "rollback point before an unrecovered loss spike"
    pre_spike: Mapping[str, str] = field(default_factory=dict)
    post_onset: Mapping[str, str] = field(default_factory=dict)
    latest: str | None = None
    latest_why: str = "named by the framework's resume pointer (what resuming loads)"
    delete_invalid: bool = False

    def rules(self) -> AnyOf:
        """The keep rules of this retention, composed (applied after `SAFETY_RULES`, in report order)."""
        rollback = {self.rollback: self.rollback_why} if self.rollback is not None else {}
        return AnyOf(
            KeepNewest(),
            KeepLast(self.keep_last),
            KeepMilestones(self.milestones),
            KeepBest(self.best),
            KeepNamed("rollback", rollback),
            KeepNamed("pre_spike", self.pre_spike),
            KeepPostOnset(self.post_onset, self.keep_last),
        )


@dataclass(frozen=True)
class Reason:
    kind: ReasonKind
    text: str


@dataclass(frozen=True)
class Context:
    """What the rules know about the whole folder (built by plan_prune)."""

    retention: Retention
    counts_resumable: bool  # keep_last counts resumable checkpoints
    ordered: tuple[Candidate, ...]  # the checkpoints keep_last counts, oldest first
    newest: Candidate | None
    post_ordered: tuple[Candidate, ...] = ()  # the post-onset checkpoints, ordered like `ordered`
    link_targets: Mapping[str, tuple[str, ...]] = field(
        default_factory=dict
    )  # name -> symlinks resolving to it
    in_flight: frozenset[str] = (
        frozenset()
    )  # newer than what Retention.latest names: a save in flight
    newest_valid: Candidate | None = (
        None  # the newest valid recognised checkpoint with a step (no symlink),
    )
    #                                              not one newer than the resume pointer (its ranks may still write)
    _windows: dict[tuple[str, int], frozenset[str]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def what(self) -> str:
        """What keep_last counts: "resumable" or "valid" checkpoints."""
        return "resumable" if self.counts_resumable else "valid"

    @property
    def post_newest(self) -> Candidate | None:
        """The newest post-onset checkpoint: justifies only older post-onset ones."""
        return self.post_ordered[-1] if self.post_ordered else None

    def last(self, n: int) -> frozenset[str]:
        """The names of the `n` newest counted checkpoints."""
        return self._window("safe", self.ordered, n)

    def post_last(self, n: int) -> frozenset[str]:
        """The names of the `n` newest post-onset checkpoints."""
        return self._window("post", self.post_ordered, n)

    def _window(self, which: str, ordered: tuple[Candidate, ...], n: int) -> frozenset[str]:
        got = self._windows.get((which, n))
        if got is None:
            got = self._windows[(which, n)] = (
                frozenset(c.name for c in ordered[-n:]) if n > 0 else frozenset()
            )
        return got

    def newer_valid(self, c: Candidate) -> Candidate | None:
        """The newest valid checkpoint (recognised, not a symlink) when its step is higher than c's: c is not
        the newest entry, so not a save in flight."""
        v = self.newest_valid
        if c.step is None or v is None or v.step is None or v.step <= c.step:
            return None
        return v

    def newer_than(self, c: Candidate) -> Candidate | None:
        """The newest counted checkpoint with a higher step than c (what justifies deleting c). A
        post-onset checkpoint is justified only by a newer post-onset one; a safe one never by those."""
        newest = self.post_newest if c.name in self.retention.post_onset else self.newest
        if newest is None or c.step is None or newest.step is None or newest.step <= c.step:
            return None
        return newest


KeepRule = Callable[[Candidate, Context], Reason | None]


def _label(c: Candidate) -> str:
    return "resumable" if c.resumable else "weights-only"


def keep_unrecognised(c: Candidate, ctx: Context) -> Reason | None:
    if c.layout is None and not c.final_export:
        return Reason(
            "unrecognised", "not recognised (name matches no known checkpoint layout exactly): kept"
        )
    return None


def keep_final_export(c: Candidate, ctx: Context) -> Reason | None:
    if c.final_export:
        return Reason(
            "final_export",
            "final export (the run folder's own top-level model files): never deleted",
        )
    return None


def keep_symlinked(c: Candidate, ctx: Context) -> Reason | None:
    if c.outside:
        return Reason(
            "symlink",
            "resolves outside ROOT: reported, not followed, never deleted, never counts as "
            "the newer checkpoint",
        )
    if c.symlink and c.links_to:
        return Reason(
            "symlink", f"symlink to {c.links_to} inside ROOT: never deleted (its target is kept)"
        )
    if c.symlink:
        return Reason("symlink", "symlink: never deleted, never counts as the newer checkpoint")
    return None


def keep_link_target(c: Candidate, ctx: Context) -> Reason | None:
    links = ctx.link_targets.get(c.name)
    if links:
        return Reason(
            "link_target",
            f"target of the symlink {', '.join(links)} in ROOT: kept while a link names it",
        )
    return None


def keep_latest(c: Candidate, ctx: Context) -> Reason | None:
    if ctx.retention.latest is not None and c.name == ctx.retention.latest:
        return Reason("latest", ctx.retention.latest_why)
    return None


def keep_in_flight(c: Candidate, ctx: Context) -> Reason | None:
    if c.name in ctx.in_flight:
        return Reason(
            "in_flight",
            f"newer than {ctx.retention.latest}, which the resume pointer names: a save "
            "possibly still in flight (other ranks); kept and not counted until the pointer "
            "moves",
        )
    return None


def keep_not_valid(c: Candidate, ctx: Context) -> Reason | None:
    """A save in flight is only the newest entry (nothing valid is newer), a writer's tmp name (tmp-checkpoint-N,
    Orbax's tmp folder) or one newer than the resume pointer (keep_in_flight); the callbacks' lock keeps their
    saves out of a prune's survey. An invalid checkpoint older than a newer valid one is none of these: kept
    by default, deleted only with Retention.delete_invalid."""
    if c.status == "valid":
        return None
    what = c.status or "not validated"
    newer = ctx.newer_valid(c)
    m = classify_name(c.name)
    if (
        c.status is None
        or newer is None
        or (m is not None and m.in_flight)
        or c.name in ctx.in_flight
    ):
        return Reason(
            "not_valid", f"{what}: not deleted automatically (a save may be in flight; inspect it)"
        )
    if ctx.retention.delete_invalid:
        return None  # no safety reason: the other rules may still keep it (a milestone, the trainer's best)
    return Reason(
        "old_invalid",
        f"{what}, older than the valid {newer.name}: not a save in flight; kept "
        f"(prune --delete-invalid removes it)",
    )


def keep_unordered(c: Candidate, ctx: Context) -> Reason | None:
    if c.step is None:
        return Reason("no_step", "no step number in its name: not ordered, kept")
    return None


def keep_unjustified(c: Candidate, ctx: Context) -> Reason | None:
    if ctx.newer_than(c) is None:
        return Reason("unjustified", f"no newer {ctx.what} checkpoint validated: kept")
    return None


#: Always applied first, whatever rules a caller passes: they can add keep reasons, never remove these.
SAFETY_RULES: tuple[KeepRule, ...] = (
    keep_symlinked,
    keep_unrecognised,
    keep_final_export,
    keep_link_target,
    keep_not_valid,
    keep_unordered,
    keep_latest,
    keep_in_flight,
)
#: Reasons that stop every other consideration (the candidate is not a deletable checkpoint).
_FINAL = frozenset({"unrecognised", "final_export", "symlink"})


# --------------------------------------------------------------------------- the policy's keep rules
# Each one small and pure, parameterised by what it keeps (Orbax's preservation policies: LatestN,
# CustomSteps, BestN, AnyPreservationPolicy). A new keep rule is one more class here, added to
# `Retention.rules` (or passed to `plan_prune(..., rules=AnyOf(*retention.rules(), MyRule()))`).


class _Rule:
    """A keep rule object: called as ``rule(candidate, context) -> Reason | None``; shown by its parameters.
    Plain classes with slots, not dataclasses: prune's import stays as cheap as the functions' was."""

    __slots__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(getattr(self, n)) for n in self.__slots__)})"


class KeepNewest(_Rule):
    """The newest counted checkpoint (resumable when the run has any): always kept."""

    def __call__(self, c: Candidate, ctx: Context) -> Reason | None:
        if ctx.newest is not None and c.name == ctx.newest.name:
            return Reason("newest", f"newest {ctx.what} checkpoint")
        return None


class KeepLast(_Rule):
    """The `n` newest counted checkpoints (one per step; the newest has its own reason)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, c: Candidate, ctx: Context) -> Reason | None:
        if c.name in ctx.last(self.n) and (ctx.newest is None or c.name != ctx.newest.name):
            return Reason("keep_last", f"within keep_last={self.n} newest {ctx.what}")
        return None


class KeepMilestones(_Rule):
    """Checkpoints at these steps."""

    __slots__ = ("steps",)

    def __init__(self, steps: Iterable[int]) -> None:
        self.steps = frozenset(steps)

    def __call__(self, c: Candidate, ctx: Context) -> Reason | None:
        if c.step is not None and c.step in self.steps:
            return Reason("milestone", f"milestone step {c.step}")
        return None


class KeepBest(_Rule):
    """The trainer's best (name -> why), and Lightning names carrying a metric (its top-k)."""

    __slots__ = ("names",)

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def __call__(self, c: Candidate, ctx: Context) -> Reason | None:
        if c.name in self.names:
            return Reason("trainer_best", self.names[c.name])
        if c.metrics:
            return Reason(
                "trainer_best",
                f"trainer's top-k by {', '.join(c.metrics)} (the metric is in its name)",
            )
        return None


class KeepNamed(_Rule):
    """Named checkpoints, each with its own why, under one reason kind: the spike guard's rollback point
    (kind "rollback") and the newest checkpoint before each spike of the log (kind "pre_spike")."""

    __slots__ = ("kind", "names")

    def __init__(self, kind: ReasonKind, names: Mapping[str, str]) -> None:
        self.kind, self.names = kind, names

    def __call__(self, c: Candidate, ctx: Context) -> Reason | None:
        if c.name in self.names:
            return Reason(self.kind, self.names[c.name])
        return None


class KeepPostOnset(_Rule):
    """Post-onset checkpoints have their own window: the `n` newest of them are kept (the spike may still
    recover); older ones go, justified by a newer post-onset one, never by a safe one."""

    __slots__ = ("names", "n")

    def __init__(self, names: Mapping[str, str], n: int) -> None:
        self.names, self.n = names, n

    def __call__(self, c: Candidate, ctx: Context) -> Reason | None:
        if c.name in self.names and c.name in ctx.post_last(self.n):
            return Reason(
                "post_onset",
                f"{self.names[c.name]}; within the keep_last={self.n} newest post-onset",
            )
        return None


class AnyOf(_Rule):
    """Rules composed: a candidate is kept when any of them keeps it; `reasons` gives every rule's reason in
    order, stopping at one that makes the candidate no deletable checkpoint at all (unrecognised, a symlink,
    the final export). Itself a keep rule (its first reason), so it nests."""

    __slots__ = ("rules",)

    def __init__(self, *rules: KeepRule) -> None:
        self.rules = rules

    def reasons(self, c: Candidate, ctx: Context) -> list[Reason]:
        out: list[Reason] = []
        for rule in self.rules:
            got = (
                rule.reasons(c, ctx)
                if isinstance(rule, AnyOf)
                else [r]
                if (r := rule(c, ctx))
                else []
            )
            out.extend(got)
            if any(r.kind in _FINAL for r in got):
                break
        return out

    def __call__(self, c: Candidate, ctx: Context) -> Reason | None:
        got = self.reasons(c, ctx)
        return got[0] if got else None


@dataclass(frozen=True)
class Decision:
    candidate: Candidate
    action: Literal["keep", "delete"]
    reasons: tuple[Reason, ...]
    justified_by: str | None = None


@dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    counts_resumable: bool
    newest: Candidate | None
    window: frozenset[str]

    @property
    def keep(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "keep"]

    @property
    def delete(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "delete"]


def _counted(
    candidates: Iterable[Candidate], unsafe: Mapping[str, str] | None = None
) -> tuple[bool, tuple[Candidate, ...]]:
    pool = [
        c
        for c in candidates
        if c.layout is not None
        and not c.final_export
        and not c.symlink
        and c.status == "valid"
        and c.step is not None
        and c.name not in (unsafe or {})
    ]
    resumable = [c for c in pool if c.resumable]
    chosen = resumable if resumable else pool
    return bool(resumable), _one_per_step(chosen)


def _one_per_step(chosen: Iterable[Candidate]) -> tuple[Candidate, ...]:
    """Oldest first, one checkpoint per step (the last name): two files of one step (Lightning's
    epoch=0-step=60.ckpt and a monitoring ModelCheckpoint's epoch=0-step=60-v1.ckpt) are one rollback point,
    so keep_last counts steps. The other is never the newest and is kept only by another rule or, at the
    newest step, because nothing newer stands in for it."""
    by_step: dict[int, Candidate] = {}
    for c in sorted(chosen, key=lambda c: (c.step, c.name)):
        by_step[c.step] = c  # type: ignore[index]  # _counted keeps only candidates with a step
    return tuple(by_step.values())


def _post_counted(
    candidates: Iterable[Candidate],
    post_onset: Mapping[str, str],
    counts_resumable: bool,
    in_flight: frozenset[str] = frozenset(),
) -> tuple[Candidate, ...]:
    """The post-onset checkpoints, ordered like the counted ones: resumable ones when the run has any
    (among the safe ones or the post-onset ones: a weights-only one never justifies deleting a resumable one)."""
    pool = [
        c
        for c in candidates
        if c.name in post_onset
        and c.name not in in_flight
        and c.layout is not None
        and not c.symlink
        and c.status == "valid"
        and c.step is not None
    ]
    resumable = [c for c in pool if c.resumable]
    chosen = resumable if resumable or counts_resumable else pool
    return _one_per_step(chosen)


def _link_targets(candidates: Iterable[Candidate]) -> dict[str, tuple[str, ...]]:
    """name -> the symlinks inside ROOT that resolve into it (entries of ROOT, and links inside them)."""
    out: dict[str, list[str]] = {}
    for c in candidates:
        if c.symlink and c.links_to and c.links_to != c.name:
            out.setdefault(c.links_to, []).append(c.name)
        for target, link in c.links_into:
            out.setdefault(target, []).append(link)
    return {k: tuple(sorted(v)) for k, v in out.items()}


def _in_flight(candidates: Iterable[Candidate], latest: str | None) -> frozenset[str]:
    """Checkpoints of the pointer's layout with a higher step than the one it names: not finished
    (DeepSpeed moves `latest` only after every rank saved)."""
    m = classify_name(latest) if latest else None
    if m is None or m.step is None:
        return frozenset()
    return frozenset(
        c.name
        for c in candidates
        if c.layout == m.layout and c.step is not None and c.step > m.step
    )


def _delete_reason(c: Candidate, newer: Candidate, ctx: Context) -> Reason:
    retention = ctx.retention
    if c.status != "valid":
        return Reason(
            "delete_invalid",
            f"{c.status}, older than the valid {newer.name}: not a save in flight; "
            f"deleted by --delete-invalid (newer {newer.name} ({_label(newer)}) validated)",
        )
    extra = "" if c.resumable or not ctx.counts_resumable else "weights-only; "
    if c.name in retention.post_onset:
        extra = "post-onset (spiked weights); " + extra
    return Reason(
        "superseded",
        f"{extra}older than keep_last={retention.keep_last}; newer {newer.name} "
        f"({_label(newer)}) validated",
    )


def plan_prune(
    candidates: Sequence[Candidate],
    retention: Retention,
    rules: KeepRule | Sequence[KeepRule] | None = None,
) -> Plan:
    """Decide keep/delete for every candidate. Pure: reads nothing, deletes nothing.

    SAFETY_RULES run first, then ``rules`` (default ``retention.rules()``; pass more to keep more, e.g.
    ``AnyOf(*retention.rules(), MyRule())``). A candidate is deleted only when no rule returns a reason and a
    newer counted checkpoint exists (resumable when the run has any, valid, recognised, not symlinked): that
    one is its ``justified_by``. Raises ValueError on duplicate names.
    """
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError("candidate names must be unique")
    ctx = _context(candidates, retention)
    policy = retention.rules() if rules is None else rules if callable(rules) else AnyOf(*rules)
    every = AnyOf(*SAFETY_RULES, policy)
    decisions = []
    for c in candidates:
        reasons = every.reasons(c, ctx)
        newer = ctx.newer_than(c)
        if not reasons and newer is None:  # nothing newer stands in for it (never optional)
            reasons.append(keep_unjustified(c, ctx) or Reason("unjustified", "kept"))
        if reasons:
            decisions.append(Decision(c, "keep", tuple(reasons)))
            continue
        assert newer is not None
        decisions.append(
            Decision(c, "delete", (_delete_reason(c, newer, ctx),), justified_by=newer.name)
        )
    return Plan(tuple(decisions), ctx.counts_resumable, ctx.newest, ctx.last(retention.keep_last))


def _context(candidates: Sequence[Candidate], retention: Retention) -> Context:
    """What the rules know of the whole folder: what keep_last counts, in flight, link targets."""
    in_flight = _in_flight(candidates, retention.latest)
    counts_resumable, ordered = _counted(
        candidates, {**retention.post_onset, **dict.fromkeys(in_flight, "")}
    )
    newest_valid = max(
        (
            c
            for c in candidates
            if c.status == "valid"
            and c.layout is not None
            and not c.symlink
            and not c.final_export
            and c.step is not None
            and c.name not in in_flight
        ),
        key=lambda c: (c.step, c.name),
        default=None,
    )
    return Context(
        retention,
        counts_resumable,
        ordered,
        ordered[-1] if ordered else None,
        _post_counted(candidates, retention.post_onset, counts_resumable, in_flight),
        _link_targets(candidates),
        in_flight,
        newest_valid,
    )
