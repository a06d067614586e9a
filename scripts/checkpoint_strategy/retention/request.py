"""`PruneRequest`: every option of one prune, each checked once, here.

The command (`prune_cli`), the callbacks (`callbacks/_retention.prune`) and any caller of `prune(root, **options)`
build one; it flows unchanged through survey -> plan -> apply (`prune.prune`) on either store (a local folder
or object storage). Resolving the policy happens here too: ``policy`` (a file, read by
`CheckpointPolicy.from_file`, or the model itself) fills ``keep_last`` and ``milestones`` where they were not
given. ``keep_last`` None after that means "propose one from the run" (a local dry run only: `prune`).

Bad input is one UsageError line (exit 2), the messages the command line has always printed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError, pydantic_message
from checkpoint_strategy.formats.models import CheckpointPolicy, Level

#: seconds a second prune of the same ROOT waits for the first one's lock
LOCK_TIMEOUT_SECONDS = 5.0
NO_RETENTION = (
    "no retention given: pass --keep-last N or --policy FILE (the plan, YAML or JSON, or the handoff "
    "state file) with a keep_last"
)


class PruneRequest(BaseModel):
    """One prune.

    root: the folder holding the checkpoints, or a prefix URL (s3://, gs://, memory://).
    keep_last / milestones: override the policy's keep_last / keep_milestone; keep_last counts resumable valid
        checkpoints when the run has any.
    policy: a policy file (`CheckpointPolicy.from_file`) or a CheckpointPolicy.
    apply: delete (default: a dry run). level: validation level of the survey (the re-check is at least full).
    log / spike_check: the training log read for an unrecovered loss spike (default: the run folder's).
    lock_timeout: seconds to wait for another prune of a local ROOT. protect: more names kept as the trainer's
        best, name -> why (the Lightning callback's best_model_path). advise: the recovery adviser
        (`checkpoint_strategy.recovery.advise`; needed when a log is read), passed in because checkpoints/ does
        not import recovery/. on_start / on_end: called once the lock is held as the survey begins, and as the
        last thing before it is released. delete_invalid: an invalid or incomplete checkpoint older than a newer
        valid one is deleted like a superseded one (default: kept and reported).
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    root: str
    keep_last: Optional[int] = None
    milestones: Optional[list[int]] = None
    policy: Optional[CheckpointPolicy] = None
    apply: bool = False
    level: Level = "quick"
    log: Optional[str] = None
    spike_check: bool = True
    lock_timeout: float = LOCK_TIMEOUT_SECONDS
    protect: Optional[dict[str, str]] = None
    advise: Optional[Callable[..., Any]] = None
    on_start: Optional[Callable[[], None]] = None
    on_end: Optional[Callable[[], None]] = None
    delete_invalid: bool = False

    @classmethod
    def of(cls, root: str | os.PathLike[str], **options: Any) -> PruneRequest:
        """The request for `prune(root, **options)`; a wrong option or type is one UsageError line."""
        try:
            return cls(root=os.fspath(root), **options)
        except ValidationError as exc:
            raise UsageError(pydantic_message(exc, "prune option")) from None

    @field_validator("keep_last", mode="before")
    @classmethod
    def _keep_last(cls, value: object) -> object:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise UsageError(f"--keep-last must be an integer of at least 1, got {value}")
        return value

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, value: object) -> object:
        if isinstance(value, (str, os.PathLike)):
            return CheckpointPolicy.from_file(value, "--policy")
        return value

    @field_validator("log", mode="before")
    @classmethod
    def _path(cls, value: object) -> object:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @model_validator(mode="after")
    def _retention(self) -> PruneRequest:
        """keep_last and milestones from the policy where not given; no keep_last at all is an error when a
        policy was given (it has none) or ROOT is object storage (nothing to propose one from)."""
        if self.keep_last is None and self.policy is not None:
            self.keep_last = self.policy.keep_last
        if self.keep_last is None and (self.policy is not None or self.is_url):
            raise UsageError(NO_RETENTION)
        if self.milestones is None and self.policy is not None:
            self.milestones = list(self.policy.keep_milestone)
        if self.milestones is None and self.keep_last is not None:
            self.milestones = []
        if self.milestones is not None:
            self.milestones = sorted(set(self.milestones))
        return self

    @property
    def is_url(self) -> bool:
        """ROOT is a prefix URL (object storage)."""
        return storage.is_url(self.root)
