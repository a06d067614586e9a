"""A minimal progress bar: stderr only, only on a terminal, only once a run passes one second."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(
        self, total: int, enabled: bool | None = None, delay: float = 1.0, stream=None
    ) -> None:
        self.stream = stream or sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self.total = total
        self.delay = delay
        self.start = time.monotonic()
        self.last = 0.0
        self.done = 0
        self.files = 0
        self.nbytes = 0
        self.shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()

    def update(self, checkpoints: int = 0, files: int = 0, update_bytes: int = 0) -> None:
        self.done += checkpoints
        self.files += files
        self.nbytes += update_bytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < self.delay or now - self.last < 0.1:
            return
        self.last = now
        self.shown = True
        frac = self.done / self.total if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        self.stream.write(
            f"\rvalidating [{bar}] {self.done}/{self.total} checkpoints, {self.files} files, "
            f"{self.nbytes / 1e9:.1f} GB"
        )
        self.stream.flush()
