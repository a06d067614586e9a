"""`--policy FILE`: one loader for every command that reads a checkpoint policy.

Accepted, detected by content (not by file name):

- the plan as YAML (``checkpoint_policy:`` mapping, what ``plan --format yaml`` prints);
- the plan as JSON (``plan --format json``: the mapping is its ``policy`` object);
- the handoff state file ``.claude/state/checkpoint-strategy.json`` (its ``policy``);
- a bare policy mapping (``keep_last: 3``, ``keep_milestone: [...]``, ...).

The file is read through ``checkpoint_strategy.storage`` (regular files only, bounded size) and
parsed with ``json`` or ``yaml.safe_load``; nothing in it is executed. Every failure is one
``UsageError`` line naming the file and what is expected (exit 2).

Public API::

    from checkpoint_strategy.retention.policyfile import load_policy_file
    loaded = load_policy_file("plan.json")        # LoadedPolicy(policy, kind, path)
    loaded.policy.keep_last, loaded.policy.keep_milestone, loaded.kind  # "plan-json"
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError

PolicyKind = Literal["plan-yaml", "plan-json", "handoff-state", "policy-mapping"]
EXPECTED = ("expected the plan (YAML with checkpoint_policy:, or plan --format json), the handoff state file "
            "checkpoint-strategy.json, or a policy mapping (keep_last, keep_milestone, ...)")
MAX_POLICY_BYTES = 16 << 20
#: keep_milestone: [1000, 5000, ...] continues by doubling (the spec's "powers of 2 * 1000"), this many times
CONTINUE_DOUBLINGS = 20


@dataclass(frozen=True)
class LoadedPolicy:
    policy: Any          # checkpoint_strategy.formats.models.CheckpointPolicy
    kind: PolicyKind
    path: str


def _parse(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text; {EXPECTED}") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            return storage.loads_json(text, where)
        except storage.ReadError as exc:
            raise UsageError(f"{where}: {exc.reason}; {EXPECTED}") from None
    try:  # syntax (with its line), deep nesting, integers past the digit limit: one line each
        return storage.loads_yaml(text, where)
    except storage.ReadError as exc:
        raise UsageError(f"{where}: {exc.reason}; {EXPECTED}") from None


def _mapping(data: Any, where: str) -> tuple[dict, PolicyKind]:
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping, got a {type(data).__name__}; {EXPECTED}")
    kind: PolicyKind
    if "checkpoint_policy" in data:
        inner, kind = data["checkpoint_policy"], "plan-yaml"
    elif "policy" in data and ("producer" in data or "next_step" in data or "schema_version" in data):
        inner, kind = data["policy"], "handoff-state"
        if inner is None:
            raise UsageError(f"{where}: the handoff state holds no policy (handoff ran without a plan); "
                             "pass the plan instead")
    elif "policy" in data:
        inner, kind = data["policy"], "plan-json"
    else:
        inner, kind = data, "policy-mapping"
    if not isinstance(inner, dict):
        raise UsageError(f"{where}: expected a mapping as the policy, got a {type(inner).__name__}; {EXPECTED}")
    return dict(inner), kind


def policy_from_data(data: Any, where: str = "policy") -> LoadedPolicy:
    """A parsed plan / handoff state / mapping -> LoadedPolicy (same detection as the file)."""
    from pydantic import ValidationError

    from checkpoint_strategy.formats.models import CheckpointPolicy
    from checkpoint_strategy.errors import pydantic_message

    inner, kind = _mapping(data, where)
    ms = inner.get("keep_milestone")
    cont = False
    if isinstance(ms, list) and ms and ms[-1] in ("...", Ellipsis, None):
        cont = True
        inner["keep_milestone"] = ms[:-1]
    try:
        policy = CheckpointPolicy.model_validate(inner)
    except ValidationError as exc:
        raise UsageError(f"{where}: " + pydantic_message(exc, "checkpoint_policy")) from None
    if cont and policy.keep_milestone:
        last = policy.keep_milestone[-1]
        extra = [last * 2 ** k for k in range(1, CONTINUE_DOUBLINGS + 1)]
        policy = policy.model_copy(update={"keep_milestone": policy.keep_milestone + extra})
    return LoadedPolicy(policy, kind, where)


def load_policy_file(path: str | os.PathLike[str], option: str = "--policy") -> LoadedPolicy:
    """Read a policy file of any accepted kind (see the module docstring). UsageError on bad input."""
    p = os.fspath(path)
    where = f"{option} {p}"
    if p == "":
        raise UsageError(f"{option}: empty path; {EXPECTED}")
    try:
        raw = storage.read_bytes(p, option, MAX_POLICY_BYTES)
    except storage.ReadError as exc:
        raise UsageError(f"{where}: cannot read ({exc.reason}); {EXPECTED}") from None
    loaded = policy_from_data(_parse(raw, where), where)
    return LoadedPolicy(loaded.policy, loaded.kind, p)
