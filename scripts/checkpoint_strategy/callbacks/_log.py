"""The callbacks' logger and line prefix (one module, so core.py and _dist.py share them without a cycle)."""

from __future__ import annotations

import logging

log = logging.getLogger("checkpoint_strategy.callbacks")
PREFIX = "checkpoint-strategy: "
