"""A preemption signal that reaches one rank alone, under 2 processes (callbacks/preempt.py's exchange): HF Trainer
under torchrun and Lightning Trainer(strategy="ddp", devices=2), gloo on CPU, the plain callbacks and the playbooks
(tests/preemptruns.py). SIGUSR1 reaches rank 1 alone at the start of step SIGNAL_STEP: both ranks make the
preemption save at one step (the next step end: the exchange started at the signal's step end is taken there; under
fit_with_recovery the guard's loss all_reduce of that step carries it) and stop, exit 0, rank 0 alone writes the
record (the signal's name, "on another rank"), the checkpoint validates, and the next 2-process launch resumes from it and trains to the end.

Before the exchange, rank 1 went into its save alone while rank 0 trained on into DDP's next all_reduce: a hang
until the grace period ran out twice (HF) and no preemption save; the subprocess timeout here fails that.
"""

from __future__ import annotations

import signal
from pathlib import Path

import cliresult
import preemptruns
import pytest
from preemptruns import SIGNAL_STEP, STEPS

pytest.importorskip("torch")

RUN_TIMEOUT = 200  # a run takes ~30 s on an idle machine; a hang meets this
PROGRAM = str(Path(preemptruns.__file__).resolve())


def launch(
    kind: str, out: Path, mode: str, signal_step: int, clean: bool = True
) -> tuple[dict, dict, str]:
    """One 2-process launch (hf: torchrun; pl: Lightning starts rank 1), bounded by RUN_TIMEOUT
    (cliresult.two_ranks: it must exit 0); each rank's result and the output. clean=False: `out` holds the
    first launch's checkpoints (the rerun resumes from them): a retry after gloo's teardown abort keeps them."""
    out.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        (out / f"result-{r}.json").unlink(missing_ok=True)
    args = [kind, str(out), mode, str(signal_step)]
    what = f"the 2-process {kind} {mode} run"
    return cliresult.two_ranks(PROGRAM, args, out, what, kind == "hf", RUN_TIMEOUT, clean)


def _checkpoint(kind: str, out: Path, step: int) -> Path:
    if kind == "hf":
        return out / f"checkpoint-{step}"
    (path,) = out.glob(f"epoch=*-step={step}.ckpt")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "playbook"])
@pytest.mark.parametrize("kind", ["hf", "pl"])
def test_sigusr1_to_rank_1_alone_saves_on_every_rank_at_one_step_stops_and_the_rerun_resumes(
    tmp_path, kind, mode
):
    from checkpoint_strategy.callbacks import last_valid_checkpoint
    from checkpoint_strategy.callbacks.preempt import read_record
    from checkpoint_strategy.validate import validate_checkpoint

    out = tmp_path / "out"
    r0, r1, text = launch(kind, out, mode, SIGNAL_STEP)
    # the exchange started at the signal's step end is taken at the next; fit_with_recovery's rides on the guard's
    # loss all_reduce of that step
    step = SIGNAL_STEP if (kind, mode) == ("pl", "playbook") else SIGNAL_STEP + 1
    path = _checkpoint(kind, out, step)
    for r in (r0, r1):
        assert r["broken"] is None, r["broken"]  # no meeting of the ranks timed out
        assert r["first"] == 1 and r["last"] == r["global_step"] == step, r
        assert r["preempted"]["step"] == step
        assert r["preempted"]["checkpoint"] == str(path)
    assert r1["preempted"]["signal"] == "SIGUSR1"
    # the signal's name where the exchange is the callback's own; the guard's loss all_reduce carries a flag
    other = "a preemption signal" if (kind, mode) == ("pl", "playbook") else "SIGUSR1"
    assert r0["preempted"]["signal"] == f"{other} on another rank"
    assert read_record(out) == r0["preempted"]  # written once, by rank 0
    assert validate_checkpoint(path, "quick").status == "valid"
    assert last_valid_checkpoint(out) == str(path)
    assert text.count(f"preemption save {path.name} (step {step})") == 2  # one line a rank

    r0, r1, _ = launch(kind, out, mode, 0, clean=False)  # the next launch resumes from it
    for r in (r0, r1):
        assert r["resumed_from"] == str(path) and r["preempted"] is None, r
        assert r["first"] == step + 1 and r["last"] == r["global_step"] == STEPS, r


class TwoRanks:
    """The exchange's collective as callbacks/_dist.Ranks answers it: each started all_reduce, once finished,
    holds the next of `answers` (the other rank's contribution) folded into what this rank sent (kept in `sent`).
    No answer left: the ranks did not meet (broken)."""

    ok = multi = True
    broken = None

    def __init__(self, *answers: float) -> None:
        self.answers, self.sent = list(answers), []

    def start(self, values, what, op="sum", src=None):
        self.sent.append((list(values), op))
        return list(values)

    def finish(self, pending, slack=0.0):
        if not self.answers:
            self.broken = "the preemption request: timed out"
            return None
        return [max(pending[0], self.answers.pop(0))]


def test_the_exchange_started_at_a_step_end_decides_at_the_next_on_every_rank():
    from checkpoint_strategy.callbacks.preempt import Preemption

    pre = Preemption(("SIGUSR1",))
    ranks = TwoRanks(0.0, float(signal.SIGUSR1))
    pre.ranks = ranks
    assert pre.at_step_end(7) is False and ranks.sent == [
        ([0.0], "max")
    ]  # started, nothing to take yet
    assert pre.at_step_end(8) is False and pre.requested is None  # step 7's: nobody had it
    assert pre.at_step_end(9) is True and pre.step == 9  # step 8's: rank 1 had SIGUSR1
    assert pre.requested == "SIGUSR1 on another rank" and pre.received_at is not None
    assert ranks.sent == [([0.0], "max")] * 2  # none started at the deciding step end
    assert pre.at_step_end(10) is False and len(ranks.sent) == 2  # once: no exchange after it
    # this rank's own signal goes out as its number; the ranks no longer meeting: this rank alone
    own = Preemption(("SIGUSR1",))
    own.ranks = TwoRanks()
    own._handler(signal.SIGUSR1, None)
    try:
        assert own.at_step_end(3) is False and own.ranks.sent == [([float(signal.SIGUSR1)], "max")]
        assert own.at_step_end(4) is True and own.ranks.broken is not None
    finally:
        own.uninstall()


def test_a_playbooks_agreement_replaces_the_exchange_and_a_save_is_no_preemption_save_by_itself():
    from checkpoint_strategy.callbacks.preempt import Preemption

    pre = Preemption(("SIGUSR1",))
    pre.ranks = TwoRanks(0.0)
    pre.agreed(5, False)
    assert pre.at_step_end(5) is False and pre.ranks.sent == []  # the playbook's all_reduce said no
    pre.agreed(5, True)
    assert (
        pre.at_step_end(6) is False and len(pre.ranks.sent) == 1
    )  # an agreement of another step: started
    pre.agreed(7, True)
    assert pre.at_step_end(7) is True and pre.requested == "a preemption signal on another rank"
    # a signal on this rank during a save: under many processes that save does not become the preemption save
    late = Preemption(("SIGUSR1",))
    late.ranks = TwoRanks()
    late.requested = "SIGUSR1"
    assert late.save_written(10) is False and late.step is None
    late.ranks = None  # one process: it does
    assert late.save_written(11) is True and late.step == 11


def test_auto_is_on_under_many_processes_when_the_request_is_exchanged():
    from checkpoint_strategy.callbacks.preempt import Preemption

    before = signal.getsignal(signal.SIGUSR1)
    auto = Preemption("auto")
    try:
        assert auto.install_for(2, ranks=TwoRanks()) is True and auto.exchanges
        assert signal.getsignal(signal.SIGUSR1) == auto._handler
    finally:
        auto.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == before
    assert Preemption("auto").install_for(2) is False  # no ranks to exchange over: off
    off = Preemption(())
    assert off.install_for(2, ranks=TwoRanks()) is False and not off.exchanges
