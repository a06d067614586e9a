"""prune on object storage (issue 15): the same decisions as on disk (one set of keep rules), a
deletion journal object written before anything is deleted, a killed prune finished by the next run,
never a prefix that is not a recognised checkpoint, a versioned bucket reported. Against moto's S3
server over HTTP (tests/objectstore.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import objectstore
import pytest

from checkpoint_strategy.retention.objects import JOURNAL

ROOT = Path(__file__).resolve().parent.parent


def _decisions(report: dict) -> list[tuple]:
    return sorted(
        (e["name"], e["action"], e["status"], tuple(e["reasons"]))
        for e in report["keep"] + report["delete"]
    )


def _names(s3, prefix: str) -> set[str]:
    base = f"{s3.name}/{prefix}/"
    return {k[len(base) :].split("/", 1)[0] for k in s3.fs.find(f"{s3.name}/{prefix}")}


def _steps(names: set[str]) -> list[int]:
    return sorted(int(n.split("-")[1]) for n in names if n.startswith("checkpoint-"))


def test_same_decisions_as_on_disk_dry_run_and_apply(hf_run, copy_of, cli_run, s3):
    local = copy_of(hf_run.output_dir, "hf")
    objectstore.upload(s3.fs, local, f"{s3.name}/hf")
    args = ("--keep-last", "2", "--no-spike-check", "--format", "json")
    disk = cli_run("prune", local, *args).json()
    remote = cli_run("prune", f"{s3.url}/hf", *args).json()
    assert _decisions(remote) == _decisions(disk) and remote["delete"]
    assert remote["root"] == f"{s3.url}/hf" and all(
        e["path"].startswith(f"{s3.url}/hf/") for e in remote["keep"]
    )
    assert _names(s3, "hf") >= {e["name"] for e in remote["delete"]}  # a dry run deletes nothing
    s3.server.reset()
    applied = cli_run("prune", f"{s3.url}/hf", *args, "--apply").json()
    assert applied["state"] == "done" and applied["deleted"] == len(remote["delete"])
    assert s3.server.counts["put"] == 1  # the journal, before any delete
    disk_applied = cli_run("prune", local, *args, "--apply").json()
    assert _decisions(applied) == _decisions(disk_applied)
    left = _names(s3, "hf")
    assert {e["name"] for e in applied["delete"]}.isdisjoint(left)
    assert {p.name for p in local.iterdir()} == left  # the same objects left as files on disk
    assert JOURNAL not in left
    assert cli_run("validate", f"{s3.url}/hf/{applied['newest_valid']}").rc == 0


def test_the_spike_guard_reads_the_log_from_s3(hf_run, copy_of, cli_run, s3):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    disk = cli_run("prune", hf_run.output_dir, "--keep-last", "2", "--format", "json").json()
    remote = cli_run("prune", f"{s3.url}/hf", "--keep-last", "2", "--format", "json").json()
    assert _decisions(remote) == _decisions(disk)
    assert remote["spike_guard"]["protected"] == disk["spike_guard"]["protected"] is not None
    assert remote["spike_guard"]["log"].startswith(f"{s3.url}/hf/")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _run_prune(url: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts")}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "checkpoint_strategy",
            "prune",
            url,
            "--keep-last",
            "2",
            "--no-spike-check",
            "--apply",
            "--format",
            "json",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _kill_when_held(s3, proc: subprocess.Popen) -> None:
    try:
        assert s3.server.held.wait(120), proc.communicate(timeout=5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        s3.server.release()
    assert proc.returncode == -signal.SIGKILL
    import tempfile

    stale = [
        n
        for n in os.listdir(tempfile.gettempdir())
        if n.startswith(f"checkpoint-strategy-view-{proc.pid}-")
    ]
    assert (
        stale
    )  # SIGKILL skipped the cleanup: the next command removes it (checked by the callers)


def test_killed_between_journal_and_deletion_the_rerun_finishes(hf_run, cli_run, s3):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    before = _names(s3, "hf")
    plan = cli_run(
        "prune", f"{s3.url}/hf", "--keep-last", "2", "--no-spike-check", "--format", "json"
    ).json()
    doomed = {e["name"] for e in plan["delete"]}
    s3.server.hold(lambda method, path, query: method == "PUT" and path.endswith(JOURNAL))
    _kill_when_held(s3, _run_prune(f"{s3.url}/hf"))
    journal = json.loads(s3.fs.cat_file(f"{s3.name}/hf/{JOURNAL}"))
    assert {e["name"] for e in journal["pending"]} == doomed
    assert _names(s3, "hf") - {JOURNAL} == before  # killed before the first delete: all intact
    dry = cli_run(
        "prune", f"{s3.url}/hf", "--keep-last", "2", "--no-spike-check", "--format", "json"
    ).json()
    assert set(dry["leftovers"]) == doomed  # the dry run reports the interrupted prune
    rerun = cli_run(
        "prune",
        f"{s3.url}/hf",
        "--keep-last",
        "2",
        "--no-spike-check",
        "--apply",
        "--format",
        "json",
    )
    report = rerun.json()
    assert report["state"] == "done", report["errors"]
    left = _names(s3, "hf")
    assert doomed.isdisjoint(left) and JOURNAL not in left
    newest = max(_steps(before))
    assert f"checkpoint-{newest}" in left
    import tempfile

    pids = [
        int(m.group(1))
        for n in os.listdir(tempfile.gettempdir())
        if (m := re.fullmatch(r"checkpoint-strategy-view-(\d+)-\w+", n))
    ]
    assert all(_alive(pid) for pid in pids)  # the killed prune's shadow was removed by the rerun
    assert cli_run("validate", f"{s3.url}/hf/checkpoint-{newest}").rc == 0


def test_killed_half_way_through_a_checkpoint_the_rerun_finishes_it(hf_run, cli_run, s3):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    before = _names(s3, "hf")
    # the first bulk delete is a checkpoint's commit markers (trainer_state.json first): hold it once done
    s3.server.hold(lambda method, path, query: method == "POST" and "delete" in query)
    _kill_when_held(s3, _run_prune(f"{s3.url}/hf"))
    oldest = f"checkpoint-{min(_steps(before))}"
    assert oldest in _names(s3, "hf")
    assert not s3.fs.exists(
        f"{s3.name}/hf/{oldest}/trainer_state.json"
    )  # half deleted: marker gone first
    check = cli_run("validate", f"{s3.url}/hf/{oldest}", "--format", "json")
    assert check.rc == 1 and check.json()["checkpoints"][0]["status"] == "incomplete"
    report = cli_run(
        "prune",
        f"{s3.url}/hf",
        "--keep-last",
        "2",
        "--no-spike-check",
        "--apply",
        "--format",
        "json",
    ).json()
    assert report["state"] == "done"
    left = _names(s3, "hf")
    assert oldest not in left and JOURNAL not in left
    assert _steps(left)[-2:] == _steps(before)[-2:]


def test_never_deletes_a_prefix_that_is_not_a_recognised_checkpoint(hf_run, cli_run, s3):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    s3.fs.pipe_file(f"{s3.name}/hf/notes/readme.txt", b"mine")
    s3.fs.pipe_file(f"{s3.name}/hf/checkpoint-old-format/x.bin", b"?")
    s3.fs.pipe_file(
        f"{s3.name}/hf-other/checkpoint-10/trainer_state.json", b"{}"
    )  # a sibling prefix
    report = cli_run(
        "prune",
        f"{s3.url}/hf",
        "--keep-last",
        "1",
        "--no-spike-check",
        "--apply",
        "--format",
        "json",
    ).json()
    assert report["state"] == "done" and report["deleted"] >= 5
    assert s3.fs.cat_file(f"{s3.name}/hf/notes/readme.txt") == b"mine"
    assert s3.fs.exists(f"{s3.name}/hf/checkpoint-old-format/x.bin")
    assert s3.fs.exists(f"{s3.name}/hf-other/checkpoint-10/trainer_state.json")


@pytest.mark.parametrize(
    "pending", [[{"name": "../hf-other"}], [{"name": "notes"}], [{"name": ".hidden"}], "x"]
)
def test_a_hostile_journal_deletes_nothing(pending, safetensors_file, cli_run, s3):
    s3.fs.pipe_file(f"{s3.name}/run/checkpoint-10/model.safetensors", safetensors_file.read_bytes())
    s3.fs.pipe_file(f"{s3.name}/run/notes/a.txt", b"a")
    s3.fs.pipe_file(
        f"{s3.name}/run/{JOURNAL}", json.dumps({"version": 1, "pending": pending}).encode()
    )
    before = set(s3.fs.find(f"{s3.name}/run"))
    cli_run("prune", f"{s3.url}/run", "--keep-last", "1", "--apply").usage_error("prune journal")
    assert set(s3.fs.find(f"{s3.name}/run")) == before


def test_a_journalled_checkpoint_that_is_now_kept_is_not_deleted(hf_run, cli_run, s3):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    newest = f"checkpoint-{max(_steps(_names(s3, 'hf')))}"
    s3.fs.pipe_file(
        f"{s3.name}/hf/{JOURNAL}",
        json.dumps({"version": 1, "pending": [{"name": newest}]}).encode(),
    )
    report = cli_run(
        "prune",
        f"{s3.url}/hf",
        "--keep-last",
        "2",
        "--no-spike-check",
        "--apply",
        "--format",
        "json",
    ).json()
    assert report["state"] == "done" and newest in _names(s3, "hf")
    assert any(newest in n and "not deleted" in n for n in report["notes"])
    assert not s3.fs.exists(f"{s3.name}/hf/{JOURNAL}")


def test_versioned_bucket_is_reported(safetensors_file, cli_run, s3):
    s3.fs.call_s3(
        "put_bucket_versioning", Bucket=s3.name, VersioningConfiguration={"Status": "Enabled"}
    )
    for step in (10, 20, 30):
        s3.fs.pipe_file(
            f"{s3.name}/run/checkpoint-{step}/model.safetensors", safetensors_file.read_bytes()
        )
        s3.fs.pipe_file(
            f"{s3.name}/run/checkpoint-{step}/trainer_state.json",
            json.dumps({"global_step": step, "log_history": []}).encode(),
        )
    r = cli_run("prune", f"{s3.url}/run", "--keep-last", "1", "--no-spike-check", "--apply")
    assert r.rc == 0, r.err
    assert "NOTE" in r.out and "versioning is Enabled" in r.out and "noncurrent versions" in r.out


def test_a_checkpoint_url_as_root_is_refused(safetensors_file, cli_run, s3):
    s3.fs.pipe_file(f"{s3.name}/run/checkpoint-10/model.safetensors", safetensors_file.read_bytes())
    cli_run("prune", f"{s3.url}/run/checkpoint-10", "--keep-last", "1").usage_error(
        "is itself a checkpoint"
    )
    cli_run(
        "prune", f"{s3.url}/run/checkpoint-10/model.safetensors", "--keep-last", "1"
    ).usage_error("is itself a checkpoint")
