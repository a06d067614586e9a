"""checkpoint-strategy: design, validate and rescue checkpointing for training runs."""

__version__ = "0.1.0"
