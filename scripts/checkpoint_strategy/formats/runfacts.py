"""Ready shell commands that act on a run's checkpoints (what the run says about itself, its
``Facts``, is read in `formats/runlog.py` beside the run's log and checkpoints).

- ``launcher()``: how to run checkpoint-strategy in a later session (the launcher's absolute
  path, else ``python3 -m checkpoint_strategy``), never a bare name that may not be on PATH.
- ``pin_command`` / ``move_aside_command``: printed for the user, never executed here.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Optional


def _quote(text: str) -> str:
    return shlex.quote(text)


def launcher() -> str:
    """The command that runs checkpoint-strategy in any later shell: python3 and the skill
    launcher's absolute path when it exists, else `python3 -m checkpoint_strategy`."""
    here = os.path.dirname(
        os.path.dirname(os.path.realpath(__file__))
    )  # .../scripts/checkpoint_strategy
    path = os.path.join(os.path.dirname(here), "checkpoint-strategy")
    if os.path.isfile(path):
        return f"python3 {_quote(path)}"
    return "python3 -m checkpoint_strategy"


def pinned_name(path: str) -> str:
    """Where a pinned copy goes: beside it, outside the checkpoint-* namespace the trainer rotates
    (HF save_total_limit globs checkpoint-*; prune never deletes a name it does not recognise)."""
    p = os.path.abspath(path)
    return os.path.join(os.path.dirname(p), "pinned-" + os.path.basename(p))


def pin_command(path: str) -> str:
    return f"cp -a {_quote(os.path.abspath(path))} {_quote(pinned_name(path))}"


def move_aside_command(
    paths: Sequence[str], root: Optional[str], onset: Optional[int]
) -> Optional[str]:
    """mkdir + mv of the post-onset checkpoints into ROOT/post-spike-<onset>/ (outside the
    checkpoint-* namespace: no trainer resumes from them by accident)."""
    if not paths:
        return None
    base = os.path.abspath(root or os.path.dirname(os.path.normpath(paths[0])))
    dest = os.path.join(base, f"post-spike-{onset}" if onset is not None else "post-spike")
    moved = " ".join(_quote(os.path.abspath(p)) for p in paths)
    return f"mkdir -p {_quote(dest)} && mv {moved} {_quote(dest)}/"
