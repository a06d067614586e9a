"""The callbacks on real 2-process runs on CPU (gloo): HF Trainer under torchrun and Lightning
Trainer(strategy="ddp", devices=2); tests/multiprocruns.py is the training program.

Each run saves every 10 steps (keep_last 1, validation and prune in the background worker) and has a
loss spike injected at step 45. Asserted from the events every rank wrote: no rank validated or
pruned while any rank was still writing; the final folder holds the newest checkpoint and the
rollback point; `validate` calls every kept checkpoint valid; the per-rank reduced verdict equals a
single-process `validate --level full` on the same checkpoint, clean and with a byte flipped in a
file another rank checked; a rank SIGKILLed in the middle of a save ends the run within a bounded
time without anything being validated or pruned after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cliresult
import pytest

from checkpoint_strategy.callbacks import last_valid_checkpoint
from checkpoint_strategy.formats.runlog import METRICS_FILE
from checkpoint_strategy.validate import validate_checkpoint

PROGRAM = str(Path(__file__).resolve().parent / "multiprocruns.py")
RUN_TIMEOUT = 420


def launch(
    kind: str, out: Path, work: Path, timeout: float = RUN_TIMEOUT, **opts
) -> subprocess.CompletedProcess:
    """One 2-process run; bounded by `timeout` (a hang fails the test, every process of the run killed). A run meant
    to succeed goes through cliresult.run_job (the one retry rule: gloo's teardown abort, from empty folders) and
    fails the test with every attempt's stderr; a run with a rank killed (kill_step) runs once, and the test reads
    how it ended. No port is picked here and bound later (another process may take it in between): torchrun
    --standalone binds its store's port itself, Lightning picks its port as it starts the second rank."""
    args = [kind, str(out), str(work), json.dumps(opts)]
    argv, env = cliresult.two_rank_launch(PROGRAM, args, kind == "hf")
    try:
        if opts.get("kill_step") is None:
            return cliresult.run_job(argv, f"the 2-process {kind} run", env, (out, work), timeout)
        return cliresult.run_once(argv, timeout, env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"the 2-process {kind} run did not end within {timeout} s: {str(exc.stderr)[-3000:]}"
        )


def events(work: Path) -> list[dict]:
    out = []
    for f in sorted(work.glob("events-*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda e: e["t"])


def write_windows(evs: list[dict], kind: str) -> list[tuple[str, float, float]]:
    """(checkpoint name, start, end) of every rank's save call."""
    open_: dict[tuple[int, int], float] = {}
    out = []
    for e in evs:
        key = (e["rank"], e["step"]) if "step" in e else None
        if e["what"] == "write_start":
            open_[key] = e["t"]
        elif e["what"] == "write_end":
            name = e.get("path") or f"checkpoint-{e['step']}"
            out.append((name, open_.pop(key), e["t"]))
    out += [(f"step {k[1]} (unfinished)", t, float("inf")) for k, t in open_.items()]
    return out


def phase_windows(evs: list[dict]) -> list[tuple[str, str, float, float]]:
    """(phase, checkpoint name, start, end) of the workers' validate / manifest / prune phases."""
    out = []
    last: dict[int, tuple[str, str, float]] = {}
    for e in evs:
        if e["what"] != "phase":
            continue
        prev = last.pop(e["rank"], None)
        if prev is not None:
            out.append((prev[0], prev[1], prev[2], e["t"]))
        if e["phase"] != "idle":
            last[e["rank"]] = (e["phase"], e["path"], e["t"])
    out += [(p, n, t, float("inf")) for p, n, t in last.values()]
    return out


#: how late a prune's end can be stamped: the worker stamps "idle" with its own clock while prune still holds the
#: folder's lock, so the training process, which takes that lock for its next save, stamps write_start after it; the
#: two clocks are the same wall clock, the allowance is for its reading. (Stamped after the lock was released, a CI run
#: on a loaded machine saw the idle-class worker build the prune's report for 21.6 ms while the save began; earlier,
#: when the training process stamped the worker's lines, its reader thread waited for the GIL 21 ms.)
PHASE_LAG = 0.02


def assert_nothing_read_while_written(evs: list[dict], kind: str, need_phases: bool = True) -> None:
    """need_phases=False: a run killed early on a busy machine, where the idle-class workers may not have had a
    cycle before the kill (no phase at all is then no read during a write)."""
    writes, phases = write_windows(evs, kind), phase_windows(evs)
    assert writes and (phases or not need_phases)
    for phase, name, start, end in phases:
        for wname, ws, we in writes:
            if phase == "prune":  # a prune surveys the whole folder
                assert we < start or ws > end - PHASE_LAG, (
                    f"prune ({start}-{end}) during the save of {wname} ({ws}-{we})"
                )
            elif wname == name:
                assert we < start, (
                    f"{phase} of {name} at {start} before its save ended at {we} on a rank"
                )


def check_run(out: Path, work: Path, newest: str, rollback: str, emergency: str, cli_run) -> dict:
    recs = json.loads((work / "records.json").read_text())
    assert recs["problems"] == [], recs["problems"]
    names = sorted(
        p.name for p in out.iterdir() if not p.name.startswith(".") and not p.name.endswith(".json")
    )
    assert {newest, rollback, emergency} <= set(names), names
    by_name = {os.path.basename(r["path"]): r for r in recs["records"]}
    deleted = {d for r in recs["records"] for d in r["deleted"]}
    assert all(
        r["status"] == "valid" or (r["status"] == "gone" and os.path.basename(r["path"]) in deleted)
        for r in recs["records"]
    ), recs["records"]  # gone: pruned before its own verdict (a newer one
    #                                                               every rank had written had validated)
    assert by_name[emergency]["emergency"] == "loss_spike_detected"
    evs = events(work)
    ends = {}
    for name, _start, end in write_windows(evs, ""):
        ends[name] = max(ends.get(name, 0.0), end)
    for phase, name, start, _end in phase_windows(
        evs
    ):  # each deletion: a newer save every rank had
        if phase != "prune":  # finished, and that validated, came first
            continue
        for d in by_name[name]["deleted"]:
            newer = [
                c
                for c, r in by_name.items()
                if (r["step"] or 0) > (by_name[d]["step"] or 0)
                and r["status"] == "valid"
                and ends.get(c, float("inf")) < start
            ]
            assert newer, (d, name, start)
    assert set(by_name) - deleted == set(names), (
        names,
        deleted,
    )  # what is gone was pruned by the rules
    res = cli_run(
        "validate", str(out), "--level", "full", "--manifest", "verify", "--format", "json"
    )
    assert res.rc == 0, res.out
    assert {c["status"] for c in res.json()["checkpoints"]} == {"valid"}
    return recs


def check_verdicts(work: Path, cli_run, reporter: int) -> None:
    """The ranks' reduced verdict equals one process's `validate --level full` on the same checkpoint."""
    got = json.loads((work / "verdicts.json").read_text())
    corrupted = Path((work / "verdict" / "corrupted.txt").read_text())
    for name in ("clean", "bad"):
        whole = cli_run(
            "validate", got[name]["path"], "--level", "full", "--format", "json"
        ).json()["checkpoints"][0]
        assert got[name]["status"] == whole["status"], (name, got[name], whole)
        if name == "bad":
            assert whole["status"] == "invalid"
            assert (
                corrupted.name in got[name]["problem"]
                and f"rank {reporter}:" in got[name]["problem"]
            ), got[name]
            assert all(p["file"].split("/")[-1] in got[name]["problem"] for p in whole["problems"])


def check_killed(res, out: Path, work: Path, survivor: str, killed_name: str) -> None:
    evs = events(work)
    killed = [e for e in evs if e["what"] == "killed"]
    assert killed and res.returncode != 0, res.stderr[-2000:]
    after = [e for e in evs if e["what"] == "phase" and e["t"] > killed[0]["t"]]
    # nothing pruned once a rank died mid-save (a prune queued before waits for the folder, then finds the
    # training gone and skips), and the save in flight is never validated (older, finished ones may be)
    assert [e for e in after if e["phase"] in ("prune", "manifest")] == [], after
    assert [e for e in evs if e["what"] == "phase" and e["path"] == killed_name] == [], after
    assert (out / survivor).exists()
    assert validate_checkpoint(out / survivor, level="full").status == "valid"
    assert_nothing_read_while_written(evs, "", need_phases=False)


# --------------------------------------------------------------------------- HF Trainer under torchrun


@pytest.fixture(scope="module")
def hf2(tmp_path_factory):
    root = tmp_path_factory.mktemp("mp-hf")
    res = launch("hf", root / "out", root / "work", spike_step=45, verdicts=True)
    assert res.returncode == 0, res.stderr[-4000:]
    return root / "out", root / "work", res


def test_hf_torchrun_keeps_newest_and_rollback_and_never_reads_a_save_in_flight(hf2, cli_run):
    out, work, _res = hf2
    check_run(out, work, "checkpoint-60", "checkpoint-40", "checkpoint-46", cli_run)
    assert_nothing_read_while_written(events(work), "hf")
    ranks = {e["rank"] for e in events(work) if e["what"] == "phase"}
    assert ranks == {0, 1}  # both ranks validated their parts
    assert last_valid_checkpoint(out) == str(out / "checkpoint-40")


def test_hf_torchrun_reduced_verdict_equals_one_process_full(hf2, cli_run):
    check_verdicts(hf2[1], cli_run, reporter=1)  # rank 1's part held the flipped byte


def test_hf_manifest_written_on_save_catches_a_later_byte_flip(hf2, cli_run, copy_of):
    path = copy_of(hf2[0] / "checkpoint-60")
    assert (path / "integrity.json").exists()
    weights = path / "model.safetensors"
    with open(
        weights, "r+b"
    ) as fh:  # the last byte of the tensor data: safetensors has no checksum
        fh.seek(-1, os.SEEK_END)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([b[0] ^ 0x01]))
    assert cli_run("validate", str(path), "--level", "full").rc == 0
    res = cli_run("validate", str(path), "--manifest", "verify")
    assert res.rc == 1 and "model.safetensors" in res.out and "sha256 mismatch" in res.out, res.out


def test_hf_torchrun_rank_killed_mid_save_ends_bounded(tmp_path):
    # each step leaves the CPU idle for 20 ms (as one waiting for its GPU): the workers, which only take idle
    # cycles, validate the saves before the kill
    res = launch(
        "hf",
        tmp_path / "out",
        tmp_path / "work",
        timeout=240,
        kill_step=30,
        rank_timeout=20,
        step_sleep=0.02,
    )
    check_killed(res, tmp_path / "out", tmp_path / "work", "checkpoint-20", "checkpoint-30")


# --------------------------------------------------------------------------- Lightning DDP, 2 processes


@pytest.fixture(scope="module")
def pl2(tmp_path_factory):
    root = tmp_path_factory.mktemp("mp-pl")
    res = launch("pl", root / "out", root / "work", spike_step=45, verdicts=True)
    assert res.returncode == 0, res.stderr[-4000:]
    return root / "out", root / "work", res


def test_lightning_ddp_keeps_newest_and_rollback_and_never_reads_a_save_in_flight(pl2, cli_run):
    out, work, _res = pl2
    # the spiked loss is step 46's; each rank's loss is averaged by an all_reduce started at step 46 and taken at
    # step 47's end (the training thread never waits for it), so the emergency save is made at step 47
    check_run(
        out,
        work,
        "epoch=0-step=60.ckpt",
        "epoch=0-step=40.ckpt",
        "epoch=0-step=47-emergency.ckpt",
        cli_run,
    )
    assert_nothing_read_while_written(events(work), "pl")
    metrics = [
        json.loads(x) for x in (out / ".checkpoint-strategy-metrics.jsonl").read_text().splitlines()
    ]
    steps = [m["step"] for m in metrics]
    assert (
        steps == sorted(set(steps)) and steps[-1] == 60
    )  # one writer: no duplicated or lost steps


def test_lightning_ddp_reduced_verdict_equals_one_process_full(pl2, cli_run):
    check_verdicts(pl2[1], cli_run, reporter=0)  # one .ckpt file: rank 0's part


def test_lightning_ddp_rank_killed_mid_save_ends_bounded(tmp_path):
    # each step leaves the CPU idle for 20 ms (as one waiting for its GPU): the workers, which only take idle
    # cycles, validate the saves before the kill
    res = launch(
        "pl",
        tmp_path / "out",
        tmp_path / "work",
        timeout=240,
        kill_step=30,
        rank_timeout=20,
        step_sleep=0.02,
    )
    check_killed(
        res, tmp_path / "out", tmp_path / "work", "epoch=0-step=20.ckpt", "epoch=0-step=30.ckpt"
    )


def test_lightning_ddp_spike_every_command_finds_the_callbacks_log_and_names_the_pre_spike_checkpoint(
    pl2, cli_run
):
    """No --log anywhere: validate, recover, prune (dry run), release-gate, handoff and last_valid_checkpoint read
    the callback's own loss log beside the checkpoints (formats/runlog.py) and name checkpoints from before the unrecovered spike (step
    46): the newest one (step 40) to resume from, recover's rollback point (its smoothed-loss rule may pick an
    earlier one) kept by prune; the post-spike step 60 never."""
    out, _work, _res = pl2
    pre, post, ours = out / "epoch=0-step=40.ckpt", out / "epoch=0-step=60.ckpt", out / METRICS_FILE
    assert last_valid_checkpoint(out) == str(pre)
    res = cli_run("validate", str(out), "--format", "json")
    safety = res.json()["safety"][0]
    assert (safety["log"], safety["newest_safe"], safety["onset_step"]) == (
        str(ours),
        str(pre),
        46,
    ), safety
    assert safety["post_onset"] == [str(out / "epoch=0-step=47-emergency.ckpt"), str(post)]
    text = cli_run("validate", str(out)).out
    assert "no training log found" not in text and "epoch=0-step=40.ckpt" in text
    rec = cli_run("recover", str(out), "--format", "json")
    assert rec.rc == 0, rec.err
    report = rec.json()
    rollback = report["resume_checkpoint"]
    assert report["log"]["path"] == str(ours) and report["spike"]["onset_step"] == 46
    assert rollback["step"] <= 40 and Path(rollback["path"]).exists(), rollback
    for keep in ("1", "2"):
        pr = cli_run("prune", str(out), "--keep-last", keep, "--format", "json")
        assert pr.rc == 0, pr.err
        got = pr.json()
        kept = {e["name"] for e in got["keep"]}
        assert {pre.name, Path(rollback["path"]).name} <= kept and not got["delete"], got["reasons"]
        assert (
            got["spike_guard"]["log"] == str(ours)
            and got["spike_guard"]["protected"] == Path(rollback["path"]).name
        )
    gates = {
        c.name: cli_run("release-gate", str(c), "--level", "quick", "--format", "json").json()
        for c in (pre, post)
    }
    assert (gates[pre.name]["gate"], gates[post.name]["gate"]) == ("pass", "fail"), gates
    state = out.parent / "handoff-state"
    doc = cli_run(
        "handoff",
        "--checkpoints",
        str(out),
        "--dry-run",
        "--state-dir",
        str(state),
        "--format",
        "json",
    ).json()
    assert (
        doc["recovery"]["log"] == str(ours)
        and doc["recovery"]["resume_checkpoint"] == rollback["path"]
    )


def test_every_rank_rolls_back_to_the_same_checkpoint_at_the_same_step(tmp_path):
    """The guard (callbacks/guard.py) in a 2-process DDP loop (tests/callbackruns.py guard_ddp): each rank feeds its
    own loss (the guard averages it over the ranks), rank 0 chooses the checkpoint (broadcast); both ranks roll back
    together, finish, and nothing hangs (the run is bounded by the test's timeout, the guard's collectives by theirs)."""
    import callbackruns

    out = tmp_path / "out"
    out.mkdir()
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(Path(callbackruns.__file__)),
        "guard",
        str(out),
    ]
    env = dict(cliresult.checkout_env(), OMP_NUM_THREADS="1")
    try:  # a retry (gloo's teardown abort) starts from an empty folder
        res = cliresult.run_job(argv, "the 2-process guard run", env, out, RUN_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"the 2-process guard run did not end within {RUN_TIMEOUT} s: {str(exc.stderr)[-3000:]}"
        )
    r0, r1 = (json.loads((out / f"result-{r}.json").read_text()) for r in (0, 1))
    assert r0["rollbacks"] == r1["rollbacks"] and len(r0["rollbacks"]) == 1
    rb = r0["rollbacks"][0]
    assert rb["onset"] == callbackruns.GUARD_POISON and rb["checkpoint"] == str(
        out / f"checkpoint-{rb['resume_step']}.pt"
    )
    assert (
        r0["last"] == r1["last"] == callbackruns.GUARD_STEPS
        and r0["stopped"] is None is r1["stopped"]
    )
    assert (
        r0["skipped_steps"] == r1["skipped_steps"]
        and callbackruns.GUARD_POISON in r0["skipped_steps"]
    )
    # rank 0 alone writes the loss log and the lines
    events = [
        json.loads(x) for x in (out / METRICS_FILE).read_text().splitlines() if '"event"' in x
    ]
    assert [e["event"].split(":")[1] for e in events] == [
        "spike",
        "rollback",
        "resume_check",
        "resume_check",
    ]
    assert res.stderr.count("rollback 1/3") == 1
