"""Log readers, checkpoint-name parsing, verify-resume, and bad input (exit 2, one stderr line)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from checkpoint_strategy.formats.steps import parse_step
from checkpoint_strategy.recovery import ckptsteps
from checkpoint_strategy.recovery.logs import read_log
from checkpoint_strategy.resources import load_schema, schema_path
from checkpoint_strategy.schemagen import render


def curve(n=600, onset=400, mag=5.0, seed=0):
    rng = np.random.default_rng(seed)
    y = 2.0 * (1 + 0.02 * rng.standard_normal(n))
    if onset is not None:
        y[onset:] *= mag
    return [float(v) for v in y]


def test_csv_with_custom_columns(tmp_path, cli_run):
    p = tmp_path / "log.csv"
    rows = ["iteration,train_nll,gnorm"] + [f"{i + 1},{v},{1.0}" for i, v in enumerate(curve())]
    p.write_text("\n".join(rows) + "\n")
    rc, out, _ = cli_run(
        "recover",
        str(p),
        "--step-column",
        "iteration",
        "--loss-column",
        "train_nll",
        "--checkpoints",
        "100,200,300,400,500",
        "--format",
        "json",
    )
    rep = json.loads(out)
    assert rc == 0 and rep["spike"]["onset_step"] == 401 and rep["resume_checkpoint"]["step"] == 300
    assert rep["log"]["format"] == "csv" and rep["log"]["loss_key"] == "train_nll"


def test_wandb_panel_export(tmp_path, cli_run):
    """W&B's panel CSV: 'Step', '<run> - <metric>' plus __MIN/__MAX, empty cells where not logged."""
    p = tmp_path / "wandb_export.csv"
    head = '"Step","brisk-pond-1 - train/loss","brisk-pond-1 - train/loss__MIN","brisk-pond-1 - train/loss__MAX"'
    rows = [head]
    for i, v in enumerate(curve()):
        rows.append(f"{i + 1},{v},{v},{v}")
        if i % 50 == 0:
            rows.append(f"{i + 1},,,")  # a step the run did not log
    p.write_text("\n".join(rows) + "\n")
    rc, out, _ = cli_run("recover", str(p), "--checkpoints", "300,350", "--format", "json")
    rep = json.loads(out)
    assert rc == 0 and rep["log"]["step_key"] == "Step" and rep["log"]["loss_key"] == "train/loss"
    assert rep["spike"]["onset_step"] == 401 and rep["resume_checkpoint"]["step"] == 350


def test_wandb_export_with_two_runs_needs_run(tmp_path, cli_run):
    p = tmp_path / "two.csv"
    rows = ["Step,a-1 - train/loss,a-1 - train/loss__MIN,b-2 - train/loss"]
    rows += [f"{i},{v},{v},{v}" for i, v in enumerate(curve(onset=None))]
    p.write_text("\n".join(rows) + "\n")
    cli_run("recover", str(p)).usage_error("--run")
    rc, out, _ = cli_run("recover", str(p), "--run", "b-2", "--format", "json")
    assert rc == 0 and json.loads(out)["status"] == "no_spike"


def test_jsonl_with_restart(tmp_path, cli_run):
    y = curve(onset=None)
    lines = [json.dumps({"step": i + 1, "loss": y[i], "lr": 1e-3}) for i in range(300)]
    lines += [
        json.dumps({"step": i + 1, "loss": y[i] * (6 if i >= 500 else 1), "lr": 1e-3})
        for i in range(250, 600)
    ]
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(lines) + "\n\n")
    rc, out, _ = cli_run("recover", str(p), "--checkpoints", "100,200,250,450", "--format", "json")
    rep = json.loads(out)
    assert rep["restarts"] == [
        {"step": 251, "previous_step": 300, "repeated_steps": 50, "entry": 300}
    ]
    assert rep["spike"]["onset_step"] == 501 and rep["resume_checkpoint"]["step"] == 450


def test_json_list_of_records(tmp_path):
    p = tmp_path / "log.json"
    p.write_text(json.dumps([{"global_step": i, "train/loss": v} for i, v in enumerate(curve())]))
    s = read_log(p)
    assert s.format == "json" and s.step_key == "global_step" and len(s.steps) == 600


def test_tensorboard_events(tmp_path, cli_run):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "tb"))
    for i, v in enumerate(curve()):
        w.add_scalar("train/loss", v, i + 1)
        w.add_scalar("train/grad_norm", 1.0, i + 1)
    w.close()
    rc, out, _ = cli_run(
        "recover", str(tmp_path / "tb"), "--checkpoints", "390", "--format", "json"
    )
    rep = json.loads(out)
    assert (
        rc == 0
        and rep["log"]["format"] == "tensorboard"
        and rep["log"]["grad_norm_key"] == "train/grad_norm"
    )
    assert rep["spike"]["onset_step"] == 401 and rep["resume_checkpoint"]["step"] == 390
    cli_run("recover", str(tmp_path / "tb"), "--tag", "nope").usage_error("no loss column 'nope'")


def test_tensorboard_missing_is_a_clear_exit_2(tmp_path, cli_run, monkeypatch):
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_accumulator", None)
    cli_run("recover", str(tmp_path)).usage_error("pip install 'checkpoint-strategy[tensorboard]'")


@pytest.mark.parametrize(
    "name,is_dir,step",
    [
        ("checkpoint-500", True, 500),
        ("step-500", True, 500),
        ("step_500", True, 500),
        ("iter_0000500", True, 500),
        ("global_step500", True, 500),
        ("epoch=3-step=500.ckpt", False, 500),
        ("epoch=0-step=10-v1.ckpt", False, 10),
        ("500", True, 500),
        ("500", False, None),
        ("500.orbax-checkpoint-tmp-17", True, None),
        ("tmp-checkpoint-500", True, None),
        ("latest", True, None),
        ("last.ckpt", False, None),
    ],
)
def test_checkpoint_names(name, is_dir, step):
    assert parse_step(name, is_dir) == step


def test_real_lightning_checkpoints(lightning_run):
    source, root, found = ckptsteps.parse_spec(str(lightning_run.ckpt_dir))
    assert source == "folder" and [s for s, _ in found] == [10, 20, 30]


def test_verify_resume_flags_jump_drop_and_lr(tmp_path, cli_run):
    y = curve(onset=None)

    def log(post_factor, lr_after):
        lines = [
            {"step": i + 1, "loss": y[i], "learning_rate": 1e-3 - i * 1e-6} for i in range(300)
        ]
        lines += [
            {"step": i + 1, "loss": y[i] * post_factor, "learning_rate": lr_after(i)}
            for i in range(200, 260)
        ]
        p = tmp_path / f"r{post_factor}.jsonl"
        p.write_text("\n".join(json.dumps(r) for r in lines))
        return str(p)

    ok = log(1.0, lambda i: 1e-3 - i * 1e-6)
    rc, out, _ = cli_run("verify-resume", ok, "--resume-step", "200", "--format", "json")
    rep = json.loads(out)
    assert (
        rc == 0
        and rep["verdict"] == "ok"
        and rep["restart_found"]
        and rep["lr_discontinuity"] is False
    )
    rc, out, _ = cli_run(
        "verify-resume",
        log(1.4, lambda i: 1e-3 - i * 1e-6),
        "--resume-step",
        "200",
        "--format",
        "json",
    )
    rep = json.loads(out)
    assert rc == 1 and rep["jump"] and not rep["drop"]
    rc, out, _ = cli_run(
        "verify-resume", log(0.7, lambda i: 1e-3 - i * 1e-6), "--resume-step", "200"
    )
    assert rc == 1 and "DROP" in out and "optimizer reset" in out
    rc, out, _ = cli_run(
        "verify-resume", log(1.0, lambda i: 0.0), "--resume-step", "200", "--format", "json"
    )
    rep = json.loads(out)
    assert rc == 1 and rep["lr_discontinuity"] is True


def test_schemas_match_models():
    from checkpoint_strategy.recovery.models import SCHEMAS

    for name, model in SCHEMAS.items():
        assert schema_path(name).read_text() == render(model), name
        assert load_schema(name)["title"] == model.__name__


BAD = {
    "empty_log_history": ('{"log_history": []}', "no log entries"),
    "zero_bytes": ("", "empty"),
    "whitespace": ("  \n ", "empty"),
    "truncated_json": (
        '{"log_history": [{"step": 1, "loss": 2.0}, {"step": 2, "lo',
        "not valid json",
    ),
    "no_loss_key": ('{"log_history": [{"step": 1, "eval_loss": 2.0}]}', "no loss column"),
    "non_numeric": (
        '{"log_history": [{"step": 1, "loss": 2.0}, {"step": 2, "loss": "abc"}]}',
        "not a number",
    ),
    "unsorted": (
        '{"log_history": ['
        + ",".join(f'{{"step": {s}, "loss": 1.0}}' for s in (5, 4, 3, 2, 1))
        + "]}",
        "out of order",
    ),
    "fractional_step": ('[{"step": 1.5, "loss": 1.0}]', "whole number"),
    "json_scalar": ("3", "neither"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_json_input_exits_2_with_one_line(case, tmp_path, cli_run):
    text, match = BAD[case]
    p = tmp_path / "trainer_state.json"
    p.write_text(text)
    cli_run("recover", str(p)).usage_error(match)
    cli_run("verify-resume", str(p), "--resume-step", "1").usage_error(match)


@pytest.mark.parametrize(
    "text,match",
    [
        ("step,loss\n", "no rows"),
        ("step,acc\n1,0.5\n", "no loss column"),
        ("step,loss\n1,0.5\n2,abc\n", "not a number"),
        ("step,loss\n1,\n2,\n", "no values"),
        ("step,loss\n3,1\n2,1\n1,1\n", "out of order"),
        ("step,loss\nx,1\n", "not a number"),
    ],
)
def test_bad_csv_exits_2(text, match, tmp_path, cli_run):
    p = tmp_path / "log.csv"
    p.write_text(text)
    cli_run("recover", str(p)).usage_error(match)


def test_bad_paths_and_arguments_exit_2(tmp_path, cli_run):
    (tmp_path / "empty_dir").mkdir()
    cli_run("recover", str(tmp_path / "empty_dir")).usage_error("no training log found")
    cli_run("recover", str(tmp_path / "missing.json")).usage_error("not found")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00\x01")
    cli_run("recover", str(tmp_path / "bin.json")).usage_error()
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps({"step": i, "loss": 1.0}) for i in range(50)))
    cli_run("recover", str(good), "--checkpoints", str(tmp_path / "nope")).usage_error("neither")
    cli_run("recover", str(good), "--checkpoints", str(tmp_path / "empty_dir")).usage_error(
        "no checkpoints found"
    )
    cli_run("recover", str(good), "--window", "2").usage_error("--window")
    cli_run("recover", str(good), "--lr-multiplier", "0").usage_error("--lr-multiplier")
    cli_run("recover", str(good), "--z", "nan").usage_error("--z")
    cli_run("recover", str(good), "--format", "yaml").usage_error()
    cli_run("verify-resume", str(good)).usage_error()
    cli_run("verify-resume", str(good), "--resume-step", "100").usage_error("no loss logged after")
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "loss": 1}\n{"step": 2, "loss"\n')
    cli_run("recover", str(tmp_path / "bad.jsonl")).usage_error("line 2")


def test_output_file_is_written(tmp_path, cli_run):
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps({"step": i, "loss": 1.0}) for i in range(50)))
    rc, out, _ = cli_run("recover", str(good), "--format", "json", "-o", str(tmp_path / "r.json"))
    assert rc == 0 and out == ""
    rep = json.loads((tmp_path / "r.json").read_text())
    import jsonschema

    jsonschema.validate(rep, load_schema("recovery-report.schema.json"))
    assert rep["status"] == "no_spike" and rep["spike"] is None and rep["resume_checkpoint"] is None


def test_folder_search_prefers_the_highest_step_over_mtime(hf_run, copy_of):
    """After `cp -r` mtimes say nothing: checkpoint-200's log wins even if 190's was touched later."""
    import os

    from checkpoint_strategy.recovery.logs import find_log

    root = copy_of(hf_run.output_dir, "run")
    later = root / "checkpoint-190" / "trainer_state.json"
    st = (root / "checkpoint-200" / "trainer_state.json").stat()
    os.utime(later, (st.st_atime + 100, st.st_mtime + 100))
    assert find_log(root) == root / "checkpoint-200" / "trainer_state.json"
    own = root / "trainer_state.json"
    own.write_text(later.read_text())
    os.utime(own, (st.st_atime + 200, st.st_mtime + 200))
    assert find_log(root) == own  # the run folder's own log, written when training ended


def _nan_in_safetensors(path) -> None:
    """Write one NaN into the first float32 tensor of a safetensors file, in place."""
    import struct

    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    with open(path, "r+b") as fh:
        fh.seek(8 + hlen + header[name]["data_offsets"][0])
        fh.write(np.float32("nan").tobytes())


def test_recover_validates_its_candidates(hf_run, copy_of, cli_run):
    """The resume point is a checkpoint the validator passes (issue 13): a truncated checkpoint-110 is
    skipped at the default quick level, a NaN weight in checkpoint-100 at --level deep, a weights-only
    checkpoint-90 (no optimizer.pt) always; each skip is named with its reason."""
    root = copy_of(hf_run.output_dir, "run")

    def resume(*argv):
        rep = cli_run("recover", str(root), "--format", "json", *argv).json()
        return rep["resume_checkpoint"]["path"], rep["warnings"]

    assert resume()[0] == str(root / "checkpoint-110")
    weights = root / "checkpoint-110" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    path, warnings = resume()
    assert path == str(root / "checkpoint-100")
    assert any(
        w.startswith("checkpoint-110 skipped: incomplete: truncated") and "model.safetensors" in w
        for w in warnings
    )
    _nan_in_safetensors(root / "checkpoint-100" / "model.safetensors")
    assert resume()[0] == str(root / "checkpoint-100")  # quick reads headers: a NaN is not seen
    path, warnings = resume("--level", "deep")
    assert path == str(root / "checkpoint-90")
    assert any(w.startswith("checkpoint-100 skipped: invalid: 1 NaN") for w in warnings), warnings
    (root / "checkpoint-90" / "optimizer.pt").unlink()
    path, warnings = resume("--level", "deep")
    assert path == str(root / "checkpoint-80")
    assert any(w.startswith("checkpoint-90 skipped: not resumable") for w in warnings), warnings
    text = cli_run("recover", str(root)).out
    assert "checkpoint-110 skipped: incomplete: truncated" in text


def test_torn_last_jsonl_line_is_left_out_with_a_note(tmp_path, cli_run):
    """Training still writing: the last line has no newline yet and is cut mid-record. recover reads the
    rest and says so; a bad line in the middle (or a complete bad last line) is still exit 2."""
    lines = [json.dumps({"step": i, "loss": 1.0}) for i in range(1, 201)]
    log = tmp_path / "train.jsonl"
    log.write_text("\n".join(lines) + "\n" + '{"step": 201, "lo')
    rep = cli_run("recover", str(log), "--format", "json").json()
    assert rep["status"] == "no_spike" and rep["log"]["last_step"] == 200
    assert any("line 201" in w and "incomplete" in w for w in rep["warnings"]), rep["warnings"]
    assert "line 201" in cli_run("recover", str(log)).out
    log.write_bytes(
        b"\n".join(x.encode() for x in lines)
        + b"\n"
        + '{"step": 201, "loss": "\u00e9'.encode()[:-1]
    )
    assert (
        cli_run("recover", str(log), "--format", "json").json()["log"]["last_step"] == 200
    )  # cut mid-character
    middle = lines[:100] + ['{"step": 101, "lo'] + lines[101:]
    log.write_text("\n".join(middle) + "\n")
    cli_run("recover", str(log)).usage_error("line 101")


def test_advise_api_reads_the_grad_norm_column_it_is_given(tmp_path):
    """A grad-norm column under a name no default matches is read when the API names it (and not otherwise)."""
    from checkpoint_strategy.recovery import advise

    y = curve(onset=None)
    gn = [1.0] * 600
    gn[450:453] = [40.0, 40.0, 40.0]
    p = tmp_path / "log.csv"
    p.write_text(
        "\n".join(["step,loss,size_of_gradients"] + [f"{i + 1},{y[i]},{gn[i]}" for i in range(600)])
        + "\n"
    )
    named = advise(str(p), "100,200,300", grad_norm_key="size_of_gradients", level=None)
    assert named.log.grad_norm_key == "size_of_gradients"
    assert [s.kind for s in named.spikes] == ["grad_norm"] and named.spikes[0].onset_step == 451
    unnamed = advise(str(p), "100,200,300", level=None)
    assert unnamed.log.grad_norm_key is None and unnamed.spikes == []


@pytest.mark.parametrize("restarts, tail", [(5, ""), (6, " and 1 more")])
def test_restart_reason_lists_five_and_counts_the_rest(tmp_path, restarts, tail):
    from checkpoint_strategy.recovery import advise

    y = curve(onset=None)
    lines, step = [], 0
    for _seg in range(restarts + 1):
        start = max(0, step - 10)  # each segment repeats the last 10 steps of the one before
        lines += [json.dumps({"step": s + 1, "loss": y[s % 600]}) for s in range(start, start + 60)]
        step = start + 60
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(lines) + "\n")
    r = advise(str(p), "10,20", level=None)
    assert len(r.restarts) == restarts
    shown = ", ".join(f"{x.previous_step}->{x.step}" for x in r.restarts[:5])
    reason = f"the log restarts {restarts} time(s) ({shown}{tail}); the latest segment wins for repeated steps"
    assert reason in r.reasons


@pytest.mark.parametrize("entries", [3, 600_000])  # read whole, and streamed (over 16 MB)
def test_a_document_with_text_after_it_is_invalid_json_not_empty(tmp_path, cli_run, entries):
    p = tmp_path / "trainer_state.json"
    history = [{"step": i, "loss": 2.0 + (i % 7) / 100} for i in range(1, entries + 1)]
    p.write_text(json.dumps({"log_history": history, "global_step": entries}) + " garbage")
    err = cli_run("recover", p).usage_error()
    assert "is not valid JSON (text after the document): Extra data at line 1 column" in err, err
    assert "empty" not in err
    # objects on lines of their own under a .json name are JSON lines, read as such
    p.write_text("".join(json.dumps(h) + "\n" for h in history[:3]))
    assert cli_run("recover", p, "--format", "json").json()["log"]["points"] == 3
