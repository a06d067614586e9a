"""Monte Carlo of a two-tier plan (`plan --local-tier`): failures only.

The model (seconds):
- Local saves every `f_local` steps stall training C_local; every r-th one (r = f_persistent / f_local) and the
  final save also write the persistent tier, stalling C_persistent more. Both start when the step ends; the
  local copy is on node-local storage P_local seconds later, the persistent copy on storage P_persistent later.
- Failures are a Poisson process (job MTBF M) striking compute, saves and restarts; each costs the restart R
  (a failure during it starts it again). A share phi of them lose a node (`--node-loss-fraction`) and with it
  the local tier: the run rolls back to the newest persistent checkpoint on storage. The others roll back to
  the newest local checkpoint on storage, or to the checkpoint the run last loaded if none is newer.
- A persistent copy still being written when a failure strikes is lost; the run remembers per run the newest
  persistent checkpoint known to be on storage.
Corruption and loss spikes are modelled for one tier only (`simulate` without --local-tier).
"""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.simulation.restart import event_budget, restart_phase

MAX_POSITIONS = 1_000_000  # local saves per run: the timeline arrays stay under ~100 MB


@dataclass(frozen=True)
class TwoTierSetup:
    total_steps: int
    step_seconds: float
    f_local: int
    f_persistent: int
    C_local: float
    P_local: float
    C_persistent: float
    P_persistent: float
    R: float
    M: float
    node_loss_fraction: float

    def timeline(self):
        """Per position p = 0..m: the end of its stalls E, when its local copy is on storage, when its persistent
        copy is (inf for local-only positions)."""
        import numpy as np

        N, f = self.total_steps, self.f_local
        m = -(-N // f)
        if m > MAX_POSITIONS:
            raise UsageError(
                f"{m} local saves per run is more than the two-tier simulation handles "
                f"({MAX_POSITIONS}); save the local tier less often or simulate fewer steps"
            )
        p = np.arange(m + 1)
        steps = np.minimum(p * f, N).astype(float)
        r = max(1, self.f_persistent // f)
        persistent = (p % r == 0) | (p == m)
        persistent[0] = False
        stall = np.where(p > 0, self.C_local + np.where(persistent, self.C_persistent, 0.0), 0.0)
        E = steps * self.step_seconds + np.cumsum(stall)
        start = E - stall
        local_ok = np.where(p > 0, start + max(self.P_local, self.C_local), 0.0)
        pers_ok = np.where(
            persistent, start + max(self.P_persistent, self.C_local + self.C_persistent), np.inf
        )
        pers_ok[0] = 0.0
        return E, local_ok, pers_ok


def setup_from_plan(report) -> TwoTierSetup:
    """A TwoTierSetup from a two-tier PlanReport."""
    t, fm = report.two_tier, report.failure_model
    lag_p = (
        fm.persist_seconds
        if (fm.async_save and fm.persist_seconds is not None)
        else fm.checkpoint_write_seconds
    )
    return TwoTierSetup(
        total_steps=report.total_steps,
        step_seconds=report.step_seconds,
        f_local=t.local.frequency_steps,
        f_persistent=t.persistent.frequency_steps,
        C_local=t.local.checkpoint_write_seconds,
        P_local=t.local.persist_seconds if fm.async_save else t.local.checkpoint_write_seconds,
        C_persistent=fm.checkpoint_write_seconds,
        P_persistent=lag_p,
        R=fm.restart_seconds,
        M=t.job_mtbf_hours * 3600.0,
        node_loss_fraction=t.node_loss_fraction,
    )


def _rollback(tf, p0, pers_known, node, local_ok, pers_time, pers_pos):
    """Where each failed run resumes: a node loss goes back to the newest persistent checkpoint on storage,
    any other failure to the newest local one (never behind the position it resumed from). Returns the
    persistent checkpoint each run now knows and the position it resumes at."""
    import numpy as np

    newest_local = np.searchsorted(local_ok, tf, side="right") - 1
    j = np.searchsorted(pers_time, tf, side="right") - 1
    newest_pers = pers_pos[np.maximum(j, 0)]
    # copies from before p0: the remembered one
    known = np.where(newest_pers > p0, newest_pers, pers_known)
    target = np.where(node, known, np.maximum(newest_local, p0))
    return np.minimum(known, target), target


def run_two_tier(setup: TwoTierSetup, runs: int, seed: int, expected_failures: float):
    """Wall seconds, failures and node losses per run (numpy arrays)."""
    import numpy as np

    max_iter = event_budget(expected_failures, "failures", "raise the MTBF or save more often")
    E, local_ok, pers_ok = setup.timeline()
    pers_pos = np.nonzero(np.isfinite(pers_ok))[0]
    pers_time = np.maximum.accumulate(pers_ok[pers_pos])  # increasing: later saves finish later
    end = float(E[-1])
    rng = np.random.default_rng(seed)
    M, R, phi = setup.M, setup.R, setup.node_loss_fraction
    idx = np.arange(runs)
    pos = np.zeros(runs, dtype=np.int64)
    pers = np.zeros(runs, dtype=np.int64)  # newest persistent checkpoint known to be on storage
    wall, fails, losses = (
        np.zeros(runs),
        np.zeros(runs, dtype=np.int64),
        np.zeros(runs, dtype=np.int64),
    )
    out_wall, out_fail, out_loss = (
        np.zeros(runs),
        np.zeros(runs, dtype=np.int64),
        np.zeros(runs, dtype=np.int64),
    )
    need = np.zeros(runs, dtype=bool)
    for _ in range(max_iter):
        if not idx.size:
            break
        X, need = restart_phase(rng.standard_exponential(idx.size) * M, need, R, wall, fails)
        comp = ~need
        t = E[pos] + X
        done = comp & (t >= end)
        fail = comp & ~done
        wall += np.where(done, end - E[pos], np.where(fail, X, 0.0))
        if fail.any():
            tf, p0 = t[fail], pos[fail]
            node = rng.random(tf.size) < phi
            pers[fail], pos[fail] = _rollback(
                tf, p0, pers[fail], node, local_ok, pers_time, pers_pos
            )
            fails[fail] += 1
            losses[fail] += node
            need[fail] = True
        if done.any():
            r = idx[done]
            out_wall[r], out_fail[r], out_loss[r] = wall[done], fails[done], losses[done]
            keep = ~done
            idx, pos, pers, wall, fails, losses, need = (
                a[keep] for a in (idx, pos, pers, wall, fails, losses, need)
            )
    else:
        if idx.size:
            raise UsageError(
                "the two-tier simulation did not finish: under this failure rate the run barely "
                "makes progress"
            )
    return out_wall, out_fail, out_loss
