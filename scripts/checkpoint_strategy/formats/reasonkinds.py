"""The kinds of reason a keep rule gives (retention.py) and a prune report records (`PruneEntry.reason_kinds`),
in a module of their own: the report models name them without importing the keep rules (the validate command
never loads retention.py)."""

from typing import Literal, get_args

ReasonKind = Literal[
    "unrecognised",  # name matches no known layout exactly
    "final_export",  # the run folder's own top-level model files
    "symlink",  # a symlink or outside ROOT
    "link_target",  # what a symlink inside ROOT resolves to (best -> checkpoint-90)
    "latest",  # named by the framework's resume pointer (DeepSpeed `latest`, Megatron's tracker file)
    "in_flight",  # a newer tag than that pointer names: still being written (other ranks), never counted
    "not_valid",  # invalid / incomplete / not validated, the newest entry or in flight
    "old_invalid",  # invalid / incomplete, older than a newer valid one: kept (prune --delete-invalid removes it)
    "no_step",  # recognised but carries no step (Lightning last.ckpt): not ordered
    "newest",  # the newest resumable (or valid) checkpoint
    "keep_last",  # within the keep_last newest
    "milestone",  # a milestone step
    "trainer_best",  # HF best_model_checkpoint, Lightning monitored top-k
    "rollback",  # the checkpoint to resume from before an unrecovered loss spike
    "pre_spike",  # the newest checkpoint before a loss spike in the log (recovered ones too)
    "post_onset",  # saved after the onset of an unrecovered spike: do not resume, never counted
    "unjustified",  # no newer validated checkpoint stands in for it
    "superseded",  # delete: older than the window, a newer one validated
    "delete_invalid",  # delete (--delete-invalid): invalid / incomplete, older than a newer valid one
]
REASON_KINDS: tuple[str, ...] = get_args(ReasonKind)
