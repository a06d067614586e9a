"""Object storage (issue 15): the same checks on s3:// (a real moto S3 server over HTTP) and
memory:// as on disk, for copies of the real HF / Lightning / DCP runs and their corrupted copies;
bounded requests; one-line errors for bad URLs, missing drivers and unreachable endpoints."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import objectstore
import pytest

from checkpoint_strategy import storage
from checkpoint_strategy.storage import remote
from checkpoint_strategy.validate.engine import validate_paths


def _shape(report: dict) -> list[tuple]:
    """Everything a validate report says per checkpoint, except where it lives."""
    out = []
    for c in report["checkpoints"]:
        rel = c["path"].rsplit("/", 1)[-1]
        out.append(
            (
                rel,
                c["format"],
                c["step"],
                c["status"],
                c["resumable"],
                c["sharded"],
                c["portability"],
                c["files_checked"],
                c["bytes_read"],
                sorted((p["file"], p["reason"], p["kind"]) for p in c["problems"]),
                sorted(c["notes"]),
            )
        )
    return sorted(out)


def _same_on_s3(cli_run, s3, local: Path, name: str, *extra) -> tuple[dict, dict]:
    objectstore.upload(s3.fs, local, f"{s3.name}/{name}")
    disk = cli_run("validate", local, "--format", "json", *extra)
    remote = cli_run("validate", f"{s3.url}/{name}", "--format", "json", *extra)
    assert remote.rc == disk.rc, (remote.err, disk.err)
    d, r = disk.json(), remote.json()
    assert _shape(r) == _shape(d)
    assert all(c["path"].startswith(f"{s3.url}/{name}") for c in r["checkpoints"])
    return d, r


def _corrupt_hf(run: Path) -> dict[str, str]:
    """Damage a copy of the HF run the ways a crash or a bad upload does; name -> what was done."""
    ck = sorted(
        (p for p in run.iterdir() if p.name.startswith("checkpoint-")),
        key=lambda p: int(p.name[11:]),
    )
    st = ck[0] / "model.safetensors"
    os.truncate(st, st.stat().st_size - 100)
    opt = ck[1] / "optimizer.pt"
    os.truncate(opt, opt.stat().st_size - 1000)  # central directory cut off
    (ck[2] / "trainer_state.json").unlink()  # half-uploaded: no commit marker
    raw = bytearray((ck[3] / "model.safetensors").read_bytes())
    raw[8] = ord("[")  # header is no longer a JSON object
    (ck[3] / "model.safetensors").write_bytes(bytes(raw))
    raw = bytearray((ck[4] / "optimizer.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a flipped byte: only the full level's CRC sees it
    (ck[4] / "optimizer.pt").write_bytes(bytes(raw))
    (ck[5] / "scheduler.pt").write_bytes(b"")
    (ck[6] / "trainer_state.json").write_text('{"global_step": 70, "log_history": [')
    return {p.name: "" for p in ck[:7]}


def test_quick_and_full_on_s3_match_disk_for_the_real_hf_run_and_its_corrupted_copy(
    hf_run, copy_of, cli_run, s3
):
    _d, r = _same_on_s3(cli_run, s3, hf_run.output_dir, "hf")
    assert r["summary"]["valid"] == len(hf_run.checkpoint_steps) >= 10
    bad = copy_of(hf_run.output_dir, "hf-bad")
    _corrupt_hf(bad)
    d, r = _same_on_s3(cli_run, s3, bad, "hf-bad")
    assert r["summary"]["invalid"] + r["summary"]["incomplete"] >= 5
    _df, rf = _same_on_s3(cli_run, s3, bad, "hf-bad-full", "--level", "full")
    assert (
        rf["summary"]["invalid"] + rf["summary"]["incomplete"]
        > r["summary"]["invalid"] + r["summary"]["incomplete"]
    )


def test_lightning_and_dcp_on_s3_match_disk_valid_and_corrupted(
    lightning_run, dcp_checkpoint, copy_of, cli_run, s3
):
    _same_on_s3(cli_run, s3, lightning_run.ckpt_dir, "pl")
    _same_on_s3(cli_run, s3, dcp_checkpoint, "step-100")
    pl = copy_of(lightning_run.ckpt_dir, "pl-bad")
    files = sorted(pl.glob("*.ckpt"))
    os.truncate(files[0], files[0].stat().st_size // 2)
    raw = bytearray(files[1].read_bytes())
    raw[len(raw) // 3] ^= 0x55
    files[1].write_bytes(bytes(raw))
    _d, r = _same_on_s3(cli_run, s3, pl, "pl-bad")
    assert r["summary"]["invalid"] + r["summary"]["incomplete"] >= 1
    _d, r = _same_on_s3(cli_run, s3, pl, "pl-bad-full", "--level", "full")
    assert r["summary"]["invalid"] + r["summary"]["incomplete"] >= 2
    dcp = copy_of(dcp_checkpoint, "step-200")
    data = next(dcp.glob("*.distcp"))
    os.truncate(data, data.stat().st_size // 2)
    _d, r = _same_on_s3(cli_run, s3, dcp, "step-200")
    assert r["checkpoints"][0]["status"] == "incomplete"
    nometa = copy_of(dcp_checkpoint, "step-300")
    (nometa / ".metadata").unlink()  # DCP's commit marker is written last
    _d, r = _same_on_s3(cli_run, s3, nometa, "step-300")
    assert "missing: .metadata" in r["checkpoints"][0]["problems"][0]["reason"]


def test_memory_url_matches_disk(hf_run, cli_run):
    import fsspec

    fs = fsspec.filesystem("memory")
    objectstore.upload(fs, hf_run.output_dir, "/issue15/hf")
    try:
        disk = cli_run("validate", hf_run.output_dir, "--format", "json").json()
        mem = cli_run("validate", "memory://issue15/hf", "--format", "json").json()
        assert _shape(mem) == _shape(disk)
        assert mem["checkpoints"][0]["path"].startswith("memory://issue15/hf/")
    finally:
        fs.rm("/issue15", recursive=True)


def test_quick_requests_are_one_listing_plus_header_reads(hf_run, cli_run, s3):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    files = sum(1 for p in hf_run.output_dir.rglob("*") if p.is_file())
    s3.server.reset()
    assert cli_run("validate", f"{s3.url}/hf", "--format", "json").rc == 0
    counts = dict(s3.server.counts)
    assert counts.get("list", 0) == 1  # one recursive listing (< 1000 keys: one page)
    assert counts.get("put", 0) == 0 and counts.get("post", 0) == 0 and counts.get("delete", 0) == 0
    # headers only: at most two ranged GETs per object (head + zip tail), never a whole big object
    assert counts["total"] - 1 <= 2 * files, counts


def test_quick_reads_only_headers_of_big_objects(tmp_path, cli_run, s3):
    import torch
    from safetensors.torch import save_file

    ck = tmp_path / "checkpoint-7"
    ck.mkdir()
    save_file({"w": torch.zeros(4096, 1024)}, str(ck / "model.safetensors"))  # 16 MB
    torch.save(
        {"state": {0: {"exp_avg": torch.zeros(4096, 1024)}}, "param_groups": []},
        ck / "optimizer.pt",
    )
    (ck / "trainer_state.json").write_text('{"global_step": 7, "log_history": []}')
    objectstore.upload(s3.fs, ck, f"{s3.name}/big/checkpoint-7")
    s3.server.reset()
    r = cli_run("validate", f"{s3.url}/big", "--format", "json").json()
    assert r["summary"]["valid"] == 1
    assert s3.server.counts["bytes_out"] < 2 << 20, dict(s3.server.counts)  # of 32 MB
    s3.server.reset()
    r = cli_run("validate", f"{s3.url}/big", "--level", "full", "--format", "json").json()
    assert (
        r["summary"]["valid"] == 1 and s3.server.counts["bytes_out"] >= 32 << 20
    )  # full: every byte


def test_the_shadow_tree_holds_no_bytes_of_the_objects(dcp_checkpoint, s3):
    objectstore.upload(s3.fs, dcp_checkpoint, f"{s3.name}/step-100")
    with storage.local_paths([f"{s3.url}/step-100"], prefetch=True) as (local,):
        names = sorted(os.listdir(local))
        assert names == sorted(p.name for p in dcp_checkpoint.iterdir())
        for n in names:
            p = os.path.join(local, n)
            assert os.path.getsize(p) == (dcp_checkpoint / n).stat().st_size
            with open(p, "rb") as fh:  # the shadow itself: zeros (sparse), never the data
                assert not fh.read().strip(b"\0")
            with storage.open_regular(p) as fh:  # through the storage layer: the object's bytes
                assert fh.read() == (dcp_checkpoint / n).read_bytes()
        view = remote.view_of(local)
        report = validate_paths([local])  # the checkers on the shadow, as a URL command runs them
        assert report.checkpoints[0].status == "valid"
        assert (
            view.blocks == {} and view.cached == 0
        )  # every fetched range dropped when its file closed
        view_root = local
    assert not os.path.exists(view_root)  # removed at the end of the command


def test_hostile_keys_are_skipped_or_escaped(safetensors_file, cli_run, s3):
    data = safetensors_file.read_bytes()
    s3.fs.pipe_file(f"{s3.name}/run/model.safetensors", data)
    s3.fs.pipe_file(f"{s3.name}/run/a b\t| x.safetensors", data)
    s3.fs.pipe_file(f"{s3.name}/run/../escape.safetensors", data)  # never a name outside the shadow
    s3.fs.pipe_file(f"{s3.name}/run/sub//x.safetensors", data)  # an empty name: skipped
    r = cli_run("validate", f"{s3.url}/run", "--format", "text")
    assert r.rc == 0, r.err
    assert r.out.count("VALID") == 2 and "a b\\t\\| x.safetensors" in r.out, r.out
    assert "escape.safetensors" not in r.out and "x.safetensors\n" not in r.out.replace(
        "| x.safetensors", ""
    )


def test_a_newline_in_a_key_cannot_forge_a_line(safetensors_file, cli_run):
    import fsspec

    fs = fsspec.filesystem(
        "memory"
    )  # moto's HTTP server refuses newlines in keys; S3 itself does not
    fs.pipe_file(
        "/issue15-nl/run/a\n- **Next step:** rm -rf ~.safetensors", safetensors_file.read_bytes()
    )
    try:
        r = cli_run("validate", "memory://issue15-nl/run", "--format", "markdown")
        assert r.rc == 0, r.err
        assert "\n- **Next step" not in r.out and "a\\n- " in r.out
    finally:
        fs.rm("/issue15-nl", recursive=True)


def test_half_uploaded_safetensors_is_truncated_on_s3_as_on_disk(
    safetensors_file, copy_of, cli_run, s3
):
    half = copy_of(safetensors_file, "half.safetensors")
    os.truncate(half, half.stat().st_size // 2)
    _d, r = _same_on_s3(cli_run, s3, half, "half.safetensors")
    assert r["checkpoints"][0]["status"] != "valid"


@pytest.mark.parametrize(
    "url, match",
    [
        ("ftp://host/x", "unknown scheme ftp://"),
        ("s3://", "expected a bucket"),
        ("s3:///runs/x", "expected a bucket"),
        ("s3://bucket/runs/../other", "'..'"),
        ("s3://bucket//x", "empty"),
        ("memory://nothing-here/at-all", "no such object or prefix"),
    ],
)
def test_bad_urls_are_one_line(url, match, cli_run):
    cli_run("validate", url).usage_error(match)


def test_missing_bucket_and_empty_prefix_are_one_line(cli_run, s3):
    cli_run("validate", "s3://no-such-bucket-issue15/run").usage_error("no-such-bucket-issue15")
    cli_run("validate", "s3://Bad_Bucket!/run").usage_error("invalid bucket name")
    cli_run("validate", f"{s3.url}/empty").usage_error("no such object or prefix")


def test_missing_driver_names_the_extra(cli_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if s3fs were not installed
    line = cli_run("validate", "s3://bucket/run").usage_error("s3fs")
    assert "checkpoint-strategy[s3]" in line
    if "gcsfs" not in sys.modules:
        try:
            import gcsfs  # noqa: F401
        except ImportError:
            assert "checkpoint-strategy[gcs]" in cli_run("validate", "gs://bucket/run").usage_error(
                "gcsfs"
            )


@pytest.mark.parametrize(
    "argv",
    [
        ("validate", "s3://bucket/run"),
        ("prune", "s3://bucket/run", "--keep-last", "1"),
        ("recover", "s3://bucket/run/checkpoint-10/trainer_state.json"),
    ],
)
def test_unreachable_endpoint_is_one_line_quickly_and_never_prints_secrets(
    argv, cli_run, monkeypatch
):
    port = objectstore.free_port()  # nothing listens there: connection refused
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAISSUE15SECRETKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "verysecretvalue15")
    import socket

    attempts = []  # "quickly": a few connection attempts, not a retry storm (counted, not timed: load-proof)
    real_connect = socket.socket.connect

    def connect(sock, address):
        if isinstance(address, tuple) and address[1:2] == (port,):
            attempts.append(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    r = cli_run(
        *argv, "--storage-option", "secret=optionsecret15", "--storage-option", "key=optionkey15"
    )
    r.usage_error("cannot connect")
    assert 1 <= len(attempts) <= 4, (
        attempts
    )  # botocore's two attempts, s3fs's one retry of them at most
    for secret in ("AKIAISSUE15SECRETKEY", "verysecretvalue15", "optionsecret15", "optionkey15"):
        assert secret not in r.err and secret not in r.out


@pytest.mark.parametrize("bad", ["novalue", "=x", "a.b.c=1", "bad key=1"])
def test_bad_storage_option_is_one_line(bad, cli_run):
    cli_run("validate", "memory://x/y", "--storage-option", bad).usage_error("--storage-option")


def test_deep_and_manifest_write_on_object_storage_are_refused(cli_run):
    cli_run("validate", "s3://bucket/run", "--level", "deep").usage_error("needs a local copy")
    cli_run("validate", "s3://bucket/run", "--manifest", "write").usage_error("local only")


def test_local_paths_are_untouched_by_the_url_layer(tmp_path):
    assert not storage.is_url(str(tmp_path)) and not storage.is_url("relative/dir")
    assert (
        storage.is_url("s3://b/p")
        and storage.is_url("memory://x")
        and not storage.is_url("file:///tmp")
    )
    with storage.local_paths([str(tmp_path), f"file://{tmp_path}"]) as out:
        assert out == [str(tmp_path), str(tmp_path)]
    with pytest.raises(Exception, match="no checkpoint recognised"):
        validate_paths([f"file://{tmp_path}"])


# --------------------------------------------------------------------------- recover


def test_recover_reads_trainer_state_and_run_prefix_from_s3(hf_run, cli_run, s3):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    rel = hf_run.trainer_state.relative_to(hf_run.output_dir).as_posix()
    disk = cli_run("recover", hf_run.trainer_state, "--format", "json").json()
    for url in (f"{s3.url}/hf/{rel}", f"{s3.url}/hf"):
        r = cli_run("recover", url, "--format", "json")
        remote = r.json()
        assert remote["status"] == disk["status"] and remote["status"] == "rollback"
        assert remote["spike"] == disk["spike"]
        assert remote["resume_checkpoint"]["step"] == disk["resume_checkpoint"]["step"]
        assert (
            remote["resume_checkpoint"]["path"]
            == f"{s3.url}/hf/checkpoint-{disk['resume_checkpoint']['step']}"
        )
        assert "checkpoint-strategy-view-" not in r.out
    text = cli_run("recover", f"{s3.url}/hf/{rel}").out
    assert f"{s3.url}/hf/" in text and "checkpoint-strategy-view-" not in text


def test_recover_missing_log_object_is_one_line_naming_the_url(cli_run, s3):
    s3.fs.pipe_file(f"{s3.name}/run/checkpoint-10/optimizer.pt", b"x")
    line = cli_run("recover", f"{s3.url}/run/checkpoint-10/trainer_state.json").usage_error(s3.url)
    assert "checkpoint-strategy-view-" not in line


# --------------------------------------------------------------------------- release-gate, handoff


def test_release_gate_on_s3_matches_disk(hf_run, copy_of, cli_run, s3):
    first = sorted(hf_run.output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[
        0
    ]
    ck = copy_of(
        first, f"hf/{first.name}"
    )  # the same run on both sides: this one checkpoint (the spike check
    objectstore.upload(s3.fs, ck, f"{s3.name}/hf/{ck.name}")  # reads the run's newest log)
    for level in ("quick", "full"):
        disk = cli_run(
            "release-gate",
            ck,
            "--level",
            level,
            "--require",
            "safetensors,resumable",
            "--format",
            "json",
        ).json()
        r = cli_run(
            "release-gate",
            f"{s3.url}/hf/{ck.name}",
            "--level",
            level,
            "--require",
            "safetensors,resumable",
            "--format",
            "json",
        )
        remote = r.json()
        assert (
            remote["checkpoint"] == f"{s3.url}/hf/{ck.name}"
            and "checkpoint-strategy-view-" not in r.out
        )
        for key in (
            "gate",
            "layout",
            "step",
            "checks",
            "checksums",
            "reasons",
        ):  # paths named as given
            assert json.dumps(remote[key]) == json.dumps(disk[key]).replace(
                str(ck.parent), f"{s3.url}/hf"
            ), key
        assert remote["gate"] == "pass"
    bad = copy_of(ck, "checkpoint-999")
    os.truncate(bad / "model.safetensors", 50)
    objectstore.upload(s3.fs, bad, f"{s3.name}/hf/checkpoint-999")
    r = cli_run("release-gate", f"{s3.url}/hf/checkpoint-999", "--format", "json")
    assert r.rc == 1 and r.json()["gate"] == "fail"
    cli_run("release-gate", f"{s3.url}/hf/{ck.name}", "--level", "deep").usage_error(
        "needs a local copy"
    )


def test_handoff_checkpoints_url_matches_disk(hf_run, cli_run, s3, tmp_path):
    objectstore.upload(s3.fs, hf_run.output_dir, f"{s3.name}/hf")
    disk = cli_run(
        "handoff", "--checkpoints", hf_run.output_dir, "--dry-run", "--format", "json"
    ).json()
    r = cli_run(
        "handoff",
        "--checkpoints",
        f"{s3.url}/hf",
        "--state-dir",
        tmp_path / "state",
        "--format",
        "json",
    )
    remote = r.json()
    assert "checkpoint-strategy-view-" not in r.out

    def same(doc: dict, root: str) -> str:
        keep = {
            k: doc[k]
            for k in (
                "latest_valid_checkpoint",
                "rollback_points",
                "bad_checkpoints",
                "recovery",
                "recovery_commands",
                "pending_risks",
                "next_action",
            )
            if k in doc
        }
        text = json.dumps(keep, sort_keys=True).replace(root, "ROOT")
        return re.sub(r'"(validated_at|generated_at)": "[^"]*"', "", text)

    assert remote["checkpoints_root"] == f"{s3.url}/hf"
    assert same(remote, f"{s3.url}/hf") == same(disk, str(hf_run.output_dir))
    assert remote["latest_valid_checkpoint"]["path"].startswith(f"{s3.url}/hf/checkpoint-")
    assert any(f"--checkpoints {s3.url}/hf" in c for c in remote["recovery_commands"])
    written = (tmp_path / "state" / "checkpoint-strategy.json").read_text()
    assert f"{s3.url}/hf" in written and "checkpoint-strategy-view-" not in written
    cli_run("handoff", "--checkpoints", f"{s3.url}/hf", "--level", "deep", "--dry-run").usage_error(
        "local copy"
    )


def test_plan_and_local_validate_never_import_fsspec(tmp_path):
    import subprocess

    code = (
        "import sys, io, contextlib; from checkpoint_strategy.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['1000', '1', '10'])\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()): "
        f"main(['validate', {str(tmp_path)!r}])\n"
        "print([m for m in ('fsspec', 's3fs', 'checkpoint_strategy.storage.remote') if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "scripts")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.stdout.strip() == "[]", proc.stderr


def test_validate_checkpoint_api_takes_a_url(dcp_checkpoint, s3):
    from checkpoint_strategy.validate.engine import validate_checkpoint

    objectstore.upload(s3.fs, dcp_checkpoint, f"{s3.name}/step-100")
    r = validate_checkpoint(f"{s3.url}/step-100")
    assert r.status == "valid" and r.format == validate_checkpoint(dcp_checkpoint).format
    assert r.path == f"{s3.url}/step-100"
    assert validate_checkpoint(f"{s3.url}/step-100", level="full").status == "valid"


def test_shadow_files_carry_the_objects_times(s3):
    s3.fs.pipe_file(f"{s3.name}/run/checkpoint-10/trainer_state.json", b"{}")
    listed = s3.fs.info(f"{s3.name}/run/checkpoint-10/trainer_state.json")[
        "LastModified"
    ].timestamp()
    with storage.local_paths([f"{s3.url}/run"]) as (local,):
        got = os.stat(os.path.join(local, "checkpoint-10", "trainer_state.json")).st_mtime
    assert abs(got - listed) < 1


@pytest.mark.parametrize("group", ["client_kwargs", "config_kwargs", "s3_additional_kwargs"])
def test_a_group_option_given_a_value_is_one_line_naming_the_dotted_form(group, cli_run):
    # issue 29: client_kwargs=notadict reached s3fs and came back as a raw AttributeError
    line = cli_run(
        "validate", "s3://bucket/run", "--storage-option", f"{group}=notadict"
    ).usage_error(group)
    assert f"{group}.KEY=VALUE" in line and "AttributeError" not in line and "notadict" not in line


def test_a_driver_type_error_is_worded_without_the_raw_exception():
    from checkpoint_strategy.storage import remote

    text = remote.describe(AttributeError("'str' object has no attribute 'copy'"))
    assert "storage options" in text and "'copy'" not in text


def test_a_missing_bucket_names_the_bucket(cli_run, s3):
    missing = s3.name + "-gone"
    line = cli_run("validate", f"s3://{missing}/run").usage_error(f"no such bucket {missing}")
    assert "empty listing" not in line
    assert "empty listing" in cli_run("validate", f"{s3.url}/empty").usage_error(
        "no such object or prefix"
    )
