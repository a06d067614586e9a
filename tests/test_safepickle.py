"""A malicious pickle is never executed, whichever command reads it (issue 41).

The payload is a real pickle whose globals, if anything resolved and called them, would run `os.system("touch
MARKER")`, `builtins.exec(...)` (a second marker file), `posix.system`, import a module that does not exist
(`FAKE`) and import the standard library's `this` (which prints on import). It is fed through every entry point
that reads pickles: validate quick / full / deep of a torch archive, a Lightning .ckpt, an HF Trainer folder's
optimizer.pt and training_args.bin, a DCP .metadata, a DeepSpeed folder's model and optimizer files; convert of
each; the optimizer-step reader. After each: no marker file, neither module imported, and the checkpoint is not
valid. The package's one pickle reader is the standard library's C unpickler restricted to this package's own
records (formats/safepickle.py); tests/test_never_execute.py guards that no other unpickler is used.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import pytest
from cliresult import run_captured

from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats.optstep import read_optimizer_steps
from checkpoint_strategy.validate.engine import validate_checkpoint

torch = pytest.importorskip("torch", reason="real torch archives to carry the payload")

FAKE = "cs_never_imported_module"


def _s(text: bytes) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text  # BINUNICODE


def payload(marker: Path) -> bytes:
    """{"system": os.system("touch MARKER"), "exec": builtins.exec(...), "fake": FAKE.payload(), "obj": a FAKE.Thing
    built by NEWOBJ + BUILD, "posix": posix.system(...), "zen": this.s}: every callable would run if resolved."""
    cmd = f"touch {marker}".encode()
    code = f"open({str(marker) + '.exec'!r}, 'w').close()".encode()
    return (
        b"\x80\x02}q\x00("
        + _s(b"system")
        + b"cos\nsystem\n"
        + _s(cmd)
        + b"\x85R"
        + _s(b"exec")
        + b"cbuiltins\nexec\n"
        + _s(code)
        + b"\x85R"
        + _s(b"fake")
        + b"c"
        + FAKE.encode()
        + b"\npayload\n)R"
        + _s(b"obj")
        + _s(FAKE.encode())
        + _s(b"Thing")
        + b"\x93)\x81}"
        + _s(b"x")
        + b"K\x01sb"
        + _s(b"posix")
        + b"cposix\nsystem\n"
        + _s(cmd)
        + b"\x85R"
        + _s(b"zen")
        + b"cthis\ns\n"
        + b"u."
    )


@pytest.fixture
def marker(tmp_path):
    m = tmp_path / "MARKER"
    sys.modules.pop(
        "this", None
    )  # (nothing in the suite imports it; so a read that resolves `this.s` shows)
    yield m
    assert not m.exists(), "os.system ran"
    assert not Path(str(m) + ".exec").exists(), "builtins.exec ran"
    assert FAKE not in sys.modules and "this" not in sys.modules, (
        "a module named by the pickle was imported"
    )


def _with_pickle(src: Path, dst: Path, data: bytes) -> Path:
    """`src` (a torch zip archive) copied to `dst` with its data.pkl replaced by `data`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info, data if info.filename.endswith("/data.pkl") else zin.read(info))
    return dst


def _poison(path: Path, marker: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    _with_pickle(path, tmp, payload(marker))
    tmp.replace(path)
    return path


def _not_valid(path: Path) -> None:
    for level in ("quick", "full", "deep"):
        assert validate_checkpoint(path, level).status != "valid", level


def test_the_reader_records_the_payload_as_names(marker):
    scan = tp.read_pickle(payload(marker))
    assert scan.complete and scan.error is None
    assert {
        "os.system",
        "builtins.exec",
        f"{FAKE}.payload",
        f"{FAKE}.Thing",
        "posix.system",
        "this.s",
    } <= set(scan.globals) | set(scan.calls)
    assert set(scan.unsafe()) >= {
        "os.system",
        "builtins.exec",
        f"{FAKE}.payload",
        "posix.system",
        "this.s",
    }
    obj = scan.root["obj"]
    assert isinstance(obj, tp.Call) and obj.name == f"{FAKE}.Thing" and obj.state == {"x": 1}
    assert isinstance(scan.root["system"], tp.Call) and scan.root["system"].args == (
        f"touch {marker}",
    )
    # read from a file as the legacy format is: the same records
    assert tp.read_pickle(io.BytesIO(payload(marker))).globals == scan.globals


def test_a_torch_archive_at_every_level_and_converted(marker, tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(3)}, good)
    bad = _with_pickle(good, tmp_path / "bad.pt", payload(marker))
    _not_valid(bad)
    reason = validate_checkpoint(bad, "quick").problems[0].reason
    assert "unsafe pickle" in reason
    for to in ("safetensors", "full", "dcp"):
        r = run_captured(["convert", bad, tmp_path / f"out-{to}", "--to", to])
        assert r.rc == 2, r.err


def test_a_lightning_ckpt(marker, tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    good = tmp_path / "good.ckpt"
    torch.save(
        {
            "state_dict": {"w": torch.ones(2)},
            "global_step": 10,
            "epoch": 0,
            "pytorch-lightning_version": "2.4.0",
            "optimizer_states": [],
            "lr_schedulers": [],
        },
        good,
    )
    for name in ("epoch=0-step=10.ckpt", "last.ckpt"):
        _with_pickle(good, folder / name, payload(marker))
        _not_valid(folder / name)
    r = run_captured(
        ["convert", folder / "last.ckpt", tmp_path / "out.safetensors", "--to", "safetensors"]
    )
    assert r.rc == 2, r.err
    run_captured(
        ["prune", tmp_path, "--keep-last", "1"]
    )  # prune's survey reads a .ckpt's callback state
    run_captured(["validate", folder, "--level", "deep"])


def _hf_checkpoint(folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors"
    )
    (folder / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    torch.save(torch.optim.lr_scheduler.StepLR(opt, 3).state_dict(), folder / "scheduler.pt")
    torch.save(
        {"python": (3, (1, 2), None), "cpu": torch.random.get_rng_state()}, folder / "rng_state.pth"
    )
    torch.save({"output_dir": "out"}, folder / "training_args.bin")
    (folder / "trainer_state.json").write_text(
        json.dumps(
            {
                "global_step": 10,
                "log_history": [],
                "best_metric": None,
                "best_model_checkpoint": None,
            }
        )
    )
    return folder


@pytest.mark.parametrize(
    "name", ["optimizer.pt", "training_args.bin", "scheduler.pt", "rng_state.pth"]
)
def test_an_hf_trainer_folder(marker, tmp_path, name):
    ckpt = _hf_checkpoint(tmp_path / "out" / "checkpoint-10")
    assert (
        validate_checkpoint(ckpt, "deep").status == "valid"
    )  # the folder is one validate accepts, unpoisoned
    _poison(ckpt / name, marker)
    _not_valid(ckpt)
    read_optimizer_steps(str(ckpt), "hf")
    run_captured(["convert", ckpt, tmp_path / "out.safetensors", "--to", "safetensors"])
    run_captured(["validate", tmp_path / "out", "--level", "deep"])


def _dcp_folder(folder: Path) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {
                "model": {"w": torch.ones(4)},
                "optimizer": {"state": {"w": {"step": torch.tensor(3.0)}}},
            },
            checkpoint_id=str(folder),
        )
    return folder


def test_a_dcp_metadata(marker, tmp_path):
    folder = _dcp_folder(tmp_path / "step-3")
    (folder / ".metadata").write_bytes(payload(marker))
    _not_valid(folder)
    read_optimizer_steps(str(folder), "dcp")
    for to in ("full", "safetensors"):
        assert run_captured(["convert", folder, tmp_path / f"out-{to}", "--to", to]).rc == 2


def test_a_dcp_item_archive(marker, tmp_path):
    """The torch archives dcp.save embeds in a .distcp (read by full and deep) carrying the payload."""
    folder = _dcp_folder(tmp_path / "step-3")
    distcp = next(folder.glob("*.distcp"))
    raw = distcp.read_bytes()
    at = raw.index(b"PK\x03\x04")
    embedded = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(raw[at:])) as zin,
        zipfile.ZipFile(embedded, "w", zipfile.ZIP_STORED) as zout,
    ):
        for info in zin.infolist():
            zout.writestr(
                info, payload(marker) if info.filename.endswith("data.pkl") else zin.read(info)
            )
    distcp.write_bytes(raw[:at] + embedded.getvalue() + raw[at + len(embedded.getvalue()) :])
    for level in ("quick", "full", "deep"):
        validate_checkpoint(folder, level)
    run_captured(["convert", folder, tmp_path / "out.pt", "--to", "full"])


@pytest.mark.parametrize(
    "which", ["mp_rank_00_model_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]
)
def test_a_deepspeed_folder(marker, tmp_path, which):
    import layouts

    root = layouts.build_deepspeed(tmp_path / "ds", steps=(10,))
    step = root / "global_step10"
    _poison(step / which, marker)
    _not_valid(step)
    read_optimizer_steps(str(step), "deepspeed")
    run_captured(["convert", root, tmp_path / "out.safetensors", "--to", "safetensors"])
    run_captured(["validate", root, "--level", "deep"])


def test_a_legacy_torch_file(marker, tmp_path):
    """torch.save(_use_new_zipfile_serialization=False): five pickles in a row, the fourth the payload."""
    good = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, good, _use_new_zipfile_serialization=False)
    raw = good.read_bytes()
    reader = io.BytesIO(raw)
    for _ in range(3):
        assert tp.read_pickle(reader).complete
    start = reader.tell()
    assert tp.read_pickle(reader).complete
    bad = tmp_path / "bad.pt"
    bad.write_bytes(raw[:start] + payload(marker) + raw[reader.tell() :])
    _not_valid(bad)
    assert (
        run_captured(["convert", bad, tmp_path / "out.safetensors", "--to", "safetensors"]).rc == 2
    )


def test_a_copy_of_the_payload_tree_is_not_executed_by_walking_it(marker):
    """What callers do with the records (walk them, print them, compare them) runs nothing either."""
    scan = tp.read_pickle(payload(marker))
    list(tp.walk_tensors(scan.root))
    repr(scan)
    assert scan.root == scan.root
