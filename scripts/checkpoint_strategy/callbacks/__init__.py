"""Training callbacks that make the checkpoint policy real inside the training loop.

    from checkpoint_strategy.callbacks import HFCheckpointStrategy          # transformers.Trainer
    from checkpoint_strategy.callbacks import LightningCheckpointStrategy   # lightning / pytorch_lightning
    from checkpoint_strategy.callbacks import last_valid_checkpoint         # resume from a whole checkpoint
    from checkpoint_strategy.callbacks import TrainingGuard                 # a plain loop's rollback playbook
    from checkpoint_strategy.callbacks import train_with_recovery           # the same around trainer.train (HF)
    from checkpoint_strategy.callbacks import fit_with_recovery             # the same around trainer.fit (Lightning)

Nothing here imports a framework until the name is used: ``HFCheckpointStrategy`` loads
transformers, ``LightningCheckpointStrategy`` loads lightning/pytorch_lightning. The framework-free
logic is in core.py; the validator/prune and the spike detector are reached only through
_retention.py and _detector.py. See docs/callbacks.md.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "HFCheckpointStrategy",
    "LightningCheckpointStrategy",
    "TrainingGuard",
    "fit_with_recovery",
    "last_valid_checkpoint",
    "train_with_recovery",
]


def __getattr__(name: str) -> Any:
    if name == "HFCheckpointStrategy":
        from checkpoint_strategy.callbacks.hf import HFCheckpointStrategy

        return HFCheckpointStrategy
    if name == "LightningCheckpointStrategy":
        from checkpoint_strategy.callbacks.lightning import LightningCheckpointStrategy

        return LightningCheckpointStrategy
    if name == "last_valid_checkpoint":
        from checkpoint_strategy.callbacks.resume import last_valid_checkpoint

        return last_valid_checkpoint
    if name == "TrainingGuard":
        from checkpoint_strategy.callbacks.guard import TrainingGuard

        return TrainingGuard
    if name == "train_with_recovery":
        from checkpoint_strategy.callbacks.hf_playbook import train_with_recovery

        return train_with_recovery
    if name == "fit_with_recovery":
        from checkpoint_strategy.callbacks.lightning_playbook import fit_with_recovery

        return fit_with_recovery
    raise AttributeError(f"module 'checkpoint_strategy.callbacks' has no attribute {name!r}")
