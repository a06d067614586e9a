"""Rank coordination for the callbacks under torchrun / Lightning DDP (see docs/callbacks.md).

Every collective is ``torch.distributed`` on the run's own (default) process group, issued from
the training thread at the same hook on every rank, and every wait is bounded: the op is started
with ``async_op=True`` and ``Work.wait(timeout)``. A collective that times out or fails (a rank
died or never came) marks the coordination broken: this rank issues no more collectives of its
own, makes no emergency save, and rank 0 prunes nothing more (an ERROR line says why). The
framework's own collectives then end the run (torchrun's and Lightning's launchers stop the other
ranks when one exits).
"""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple, Optional

from checkpoint_strategy.callbacks._log import PREFIX, log

TEXT_BYTES = 480  # one problem line per rank in a reduced verdict


class Pending(NamedTuple):
    """A collective started with Ranks.start: its tensor (the result once done), work handle, purpose."""

    tensor: Any
    work: Any
    what: str


class Ranks:
    """This process's rank in the run (rank 0 of 1 without torch.distributed)."""

    def __init__(self, timeout: float = 600.0) -> None:
        self.rank, self.world, self.timeout = 0, 1, float(timeout)
        self.broken: Optional[str] = None
        self._dist: Any = None
        self._device: Any = None
        try:
            import torch.distributed as dist
        except ImportError:
            return
        if dist.is_available() and dist.is_initialized():
            self._dist = dist
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            if "nccl" in str(dist.get_backend()).lower():  # NCCL reduces device tensors only
                import torch

                self._device = torch.device("cuda", torch.cuda.current_device())

    @property
    def multi(self) -> bool:
        return self.world > 1

    @property
    def ok(self) -> bool:
        return self.world > 1 and self.broken is None

    def _run(
        self,
        values: list[float],
        what: str,
        op: str = "max",
        src: Optional[int] = None,
        slack: float = 0.0,
    ) -> Optional[list]:
        """all_reduce (op max/min/sum) or broadcast from src of a small vector; None when broken. Waits
        at most timeout + slack seconds (slack: what another rank may spend on its own bounded wait
        before it comes, e.g. for its worker)."""
        if not self.multi:
            return list(values)
        return self.finish(self.start(values, what, op, src), slack)

    def start(
        self, values: list[float], what: str, op: str = "sum", src: Optional[int] = None
    ) -> Optional[Pending]:
        """Issue the collective of `values` without waiting for it (finish() takes the result); None when
        broken or single-process. Every rank must issue the same collectives in the same order."""
        if not self.multi or self.broken is not None:
            return None
        import torch

        dist = self._dist
        t = torch.tensor(values, dtype=torch.float64, device=self._device)
        try:
            if src is not None:
                work = dist.broadcast(t, src=src, async_op=True)
            else:
                work = dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()), async_op=True)
        except Exception as exc:  # noqa: BLE001 - a dead or late rank: bounded, reported, never raised
            self._break(what, exc, 0.0)
            return None
        return Pending(t, work, what)

    def finish(self, pending: Optional[Pending], slack: float = 0.0) -> Optional[list]:
        """The result of a started collective (waits at most timeout + slack seconds); None when broken."""
        if pending is None or self.broken is not None:
            return None

        try:
            pending.work.wait(timeout=datetime.timedelta(seconds=self.timeout + slack))
        except Exception as exc:  # noqa: BLE001 - a dead or late rank: bounded, reported, never raised
            self._break(pending.what, exc, slack)
            return None
        return pending.tensor.tolist()

    def _break(self, what: str, exc: Exception, slack: float) -> None:
        self.broken = (
            f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        )
        log.error(
            PREFIX
            + f"rank {self.rank}: ranks did not meet within {self.timeout + slack:g} s ({self.broken}); "
            "no more validation verdicts, prunes or emergency saves from this rank"
        )

    def barrier(self, what: str, slack: float = 0.0) -> bool:
        """Every rank got here (e.g. finished writing its files). False when broken or timed out."""
        return self._run([0.0], what, slack=slack) is not None

    def reduce(
        self, values: list[float], what: str, op: str = "max", slack: float = 0.0
    ) -> Optional[list]:
        return self._run(values, what, op, slack=slack)

    def broadcast(self, values: list[float], what: str, src: int = 0) -> Optional[list]:
        return self._run(values, what, src=src)

    def gather_text(self, text: str, what: str) -> Optional[list[str]]:
        """Each rank's line (at most TEXT_BYTES bytes), in rank order: one sum-reduce of a byte table."""
        if not self.multi:
            return [text]
        raw = text.encode("utf-8", "replace")[:TEXT_BYTES]
        table = [0.0] * (self.world * TEXT_BYTES)
        for i, b in enumerate(raw):
            table[self.rank * TEXT_BYTES + i] = float(b)
        out = self._run(table, what, "sum")
        if out is None:
            return None
        lines = []
        for r in range(self.world):
            chunk = bytes(int(v) for v in out[r * TEXT_BYTES : (r + 1) * TEXT_BYTES]).rstrip(b"\0")
            lines.append(chunk.decode("utf-8", "replace"))
        return lines
