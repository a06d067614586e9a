"""`convert`: torch archives, safetensors and DCP folders written by torch itself, converted and checked.

Every conversion is cross-checked here by loading both sides with torch (the package never does) and
comparing every tensor exactly; the hostile inputs must exit 2 with one line and leave nothing at DST.
Real framework runs (HF Trainer, Lightning, FSDP2 under torchrun, DeepSpeed ZeRO-2) are in
tests/test_convert_frameworks.py (slow).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from cliresult import CLI, checkout_env
from fuzzcheck import MUTATE, reached, reaches_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".convert-" in p.name]


@pytest.fixture(scope="module")
def tied_bin(tmp_path_factory) -> Path:
    """A GPT-2-like state dict saved by torch.save: lm_head shares wte's storage (as transformers 4 wrote
    pytorch_model.bin), a view into a bigger storage, bf16 and int64 tensors, a scalar."""
    torch.manual_seed(0)
    wte = torch.randn(64, 32)
    big = torch.randn(10, 8)
    sd = {
        "transformer.wte.weight": wte,
        "transformer.h.0.w": torch.randn(32, 96).to(torch.bfloat16),
        "transformer.h.0.b": big[2:5],  # a contiguous view at an offset of a bigger storage
        "transformer.ids": torch.arange(7),
        "scale": torch.tensor(0.5),
        "lm_head.weight": wte,
    }
    folder = tmp_path_factory.mktemp("tied") / "model"
    folder.mkdir()
    torch.save(sd, folder / "pytorch_model.bin")
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    return folder


def _load_st(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_torch_archive_to_safetensors_equal_tensors_tied_weight_left_out(
    cli_run, tied_bin, tmp_path
):
    dst = tmp_path / "st"
    r = cli_run("convert", tied_bin, dst, "--to", "safetensors", "--format", "json")
    report = r.json()
    assert r.rc == 0 and report["written"] and report["check"]["ok"]
    src = torch.load(tied_bin / "pytorch_model.bin", weights_only=True)
    got = _load_st(dst)
    assert set(got) == set(src) - {"lm_head.weight"}  # what save_pretrained writes for tied weights
    for k, v in got.items():
        assert v.dtype == src[k].dtype and torch.equal(v, src[k]), k
    rows = {row["name"]: row for row in report["check"]["rows"]}
    assert (
        rows["lm_head.weight"]["status"] == "tied"
        and rows["lm_head.weight"]["detail"] == "transformer.wte.weight"
    )
    assert report["check"]["equal"] == 5 and report["check"]["tied"] == 1
    assert (dst / "config.json").read_text() == '{"model_type": "gpt2"}'  # from_pretrained needs it
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "model.safetensors"]
    assert _leftovers(tmp_path) == []


def test_keep_tied_writes_each_name_with_its_own_bytes(cli_run, tied_bin, tmp_path):
    r = cli_run(
        "convert",
        tied_bin,
        tmp_path / "st",
        "--to",
        "safetensors",
        "--keep-tied",
        "--format",
        "json",
    )
    assert r.rc == 0, r.err
    got = _load_st(tmp_path / "st")
    assert torch.equal(got["lm_head.weight"], got["transformer.wte.weight"])
    assert r.json()["check"]["tied"] == 0


def test_sharded_like_hugging_face_with_index(cli_run, tied_bin, tmp_path):
    dst = tmp_path / "st"
    r = cli_run(
        "convert",
        tied_bin,
        dst,
        "--to",
        "safetensors",
        "--max-shard-size",
        "8KB",
        "--format",
        "json",
    )
    assert r.rc == 0, r.err
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in dst.glob("*.safetensors"))
    assert shards == [
        f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
    ]
    assert len(shards) >= 2 and set(index["weight_map"].values()) == set(shards)
    src = torch.load(tied_bin / "pytorch_model.bin", weights_only=True)
    assert index["metadata"]["total_size"] == sum(
        v.numel() * v.element_size() for k, v in src.items() if k != "lm_head.weight"
    )
    from safetensors import safe_open

    for name, shard in index["weight_map"].items():
        with safe_open(str(dst / shard), "pt") as f:
            assert torch.equal(f.get_tensor(name), src[name])
            assert f.metadata() == {"format": "pt"}


def test_converted_safetensors_pass_validate_deep(cli_run, tied_bin, tmp_path):
    assert cli_run("convert", tied_bin, tmp_path / "st", "--to", "safetensors").rc == 0
    r = cli_run("validate", tmp_path / "st", "--level", "deep", "--format", "json")
    assert r.rc == 0 and r.json()["checkpoints"][0]["status"] == "valid", r.out


def test_non_contiguous_tensor_is_refused_by_name(cli_run, tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"ok": torch.zeros(3), "transposed": torch.randn(4, 6).t()}, path)
    line = cli_run("convert", path, tmp_path / "out", "--to", "safetensors").usage_error(
        "transposed"
    )
    assert "non-contiguous" in line
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_full_to_dcp_and_back_through_torch_equal(cli_run, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 6)).sum().backward()
    opt.step()
    src = tmp_path / "full.pt"
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}, src
    )  # one optimizer step
    r = cli_run("convert", src, tmp_path / "dcp", "--to", "dcp", "--format", "json")
    assert r.rc == 0 and r.json()["check"]["optimizer"]["complete"], r.out
    deep = cli_run("validate", tmp_path / "dcp", "--level", "deep", "--format", "json")
    seen = deep.json()["checkpoints"][0]["deep"]["optimizer"]
    assert (
        deep.rc == 0 and seen["kind"] == "adam" and seen["with_moments"] == seen["parameters"] == 4
    ), deep.out
    # torch's own DCP loader reads it (every tensor one chunk; it re-shards on load)
    target = {
        "model": torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2)).state_dict()
    }
    dcp.load(target, checkpoint_id=str(tmp_path / "dcp"))
    for k, v in model.state_dict().items():
        assert torch.equal(target["model"][k], v), k
    dcp_to_torch_save(str(tmp_path / "dcp"), str(tmp_path / "back.pt"))
    back = torch.load(tmp_path / "back.pt", weights_only=False)
    assert (
        back["step"] == 1 and back["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
    )
    for pid, entry in opt.state_dict()["state"].items():
        for k, v in entry.items():
            assert torch.equal(back["optimizer"]["state"][str(pid)][k], v)  # DCP keys are strings
    # and back to one full archive with this tool: torch.load(weights_only=True) reads it
    r = cli_run("convert", tmp_path / "dcp", tmp_path / "again.pt", "--to", "full")
    assert r.rc == 0, r.err
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    assert again["step"] == 1 and all(
        torch.equal(again["model"][k], v) for k, v in model.state_dict().items()
    )


def test_check_only_compares_dcp_to_torch_save_output_and_finds_a_changed_byte(cli_run, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    torch.manual_seed(0)
    state = {
        "model": {"w": torch.randn(8, 4), "b": torch.randn(4)},
        "extra": {"n": torch.arange(3)},
    }
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
    dcp_to_torch_save(str(tmp_path / "dcp"), str(tmp_path / "full.pt"))
    r = cli_run(
        "convert", tmp_path / "dcp", tmp_path / "full.pt", "--check-only", "--format", "json"
    )
    report = r.json()
    assert r.rc == 0 and report["check"]["equal"] == 3 and not report["written"]
    # flip one byte of w's storage inside the consolidated archive: the check names the tensor
    with zipfile.ZipFile(tmp_path / "full.pt") as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data/0"))
        assert info.compress_type == 0
        with open(tmp_path / "full.pt", "rb") as fh:
            fh.seek(info.header_offset + 26)
            nlen, xlen = struct.unpack("<HH", fh.read(4))
    at = info.header_offset + 30 + nlen + xlen
    data = bytearray((tmp_path / "full.pt").read_bytes())
    data[at] ^= 0xFF
    (tmp_path / "full.pt").write_bytes(bytes(data))
    r = cli_run(
        "convert", tmp_path / "dcp", tmp_path / "full.pt", "--check-only", "--format", "json"
    )
    bad = [row for row in r.json()["check"]["rows"] if row["status"] != "equal"]
    assert r.rc == 1 and len(bad) == 1 and bad[0]["status"] == "bytes differ"


# --------------------------------------------------------------------------- hostile inputs: exit 2, nothing left


def _malicious_archive(path: Path, marker: Path) -> None:
    """A torch zip whose data.pkl calls os.system('touch MARKER') when unpickled."""
    payload = (
        b"\x80\x02cos\nsystem\n(X"
        + struct.pack("<I", len(f"touch {marker}"))
        + f"touch {marker}".encode()
        + b"tR."
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/version", "3\n")


def test_malicious_pickle_is_reported_and_never_run(cli_run, tmp_path):
    marker = tmp_path / "MARKER"
    src = tmp_path / "evil.pt"
    _malicious_archive(src, marker)
    for target, dst in (("safetensors", "out-st"), ("full", "out-full.pt"), ("dcp", "out-dcp")):
        line = cli_run("convert", src, tmp_path / dst, "--to", target).usage_error("unsafe pickle")
        assert "system" in line
        assert not (tmp_path / dst).exists()
    assert not marker.exists() and _leftovers(tmp_path) == []


def test_truncated_source_exit_2_nothing_left(cli_run, tied_bin, tmp_path):
    data = (tied_bin / "pytorch_model.bin").read_bytes()
    src = tmp_path / "cut.bin"
    src.write_bytes(data[: len(data) // 2])
    cli_run("convert", src, tmp_path / "out", "--to", "safetensors").usage_error("cut.bin")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_lying_safetensors_header_exit_2(cli_run, tmp_path):
    from safetensors.torch import save_file

    src = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(16, 16)}, str(src))
    raw = bytearray(src.read_bytes())
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    header["a"]["data_offsets"][1] += 4096  # claims bytes the file does not hold
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    src.write_bytes(struct.pack("<Q", len(text)) + text + bytes(raw[8 + hlen :]))
    cli_run("convert", src, tmp_path / "out", "--to", "dcp").usage_error("w.safetensors")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


@pytest.fixture
def small_dcp(tmp_path) -> Path:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    folder = tmp_path / "src" / "step-1"
    dcp.save({"model": {"w": torch.randn(4, 4)}}, checkpoint_id=str(folder))
    return folder


def test_dcp_entry_pointing_outside_the_folder_exit_2(cli_run, small_dcp, tmp_path):
    meta = small_dcp / ".metadata"
    raw = meta.read_bytes()
    assert b"__0_0.distcp" in raw
    meta.write_bytes(
        raw.replace(b"__0_0.distcp", b"../_0.distcp")
    )  # same length: the pickle stays whole
    (small_dcp.parent / "_0.distcp").write_bytes((small_dcp / "__0_0.distcp").read_bytes())
    line = cli_run("convert", small_dcp, tmp_path / "out.pt", "--to", "full").usage_error(
        "outside the folder"
    )
    assert ".metadata" in line
    assert not (tmp_path / "out.pt").exists() and _leftovers(tmp_path) == []


def test_dcp_data_file_symlinked_outside_exit_2(cli_run, small_dcp, tmp_path):
    outside = tmp_path / "elsewhere.distcp"
    os.replace(small_dcp / "__0_0.distcp", outside)
    os.symlink(outside, small_dcp / "__0_0.distcp")
    cli_run("convert", small_dcp, tmp_path / "out", "--to", "safetensors").usage_error(
        "resolves outside"
    )
    assert not (tmp_path / "out").exists()


def test_truncated_dcp_data_exit_2(cli_run, small_dcp, tmp_path):
    data = (small_dcp / "__0_0.distcp").read_bytes()
    (small_dcp / "__0_0.distcp").write_bytes(data[:-40])
    cli_run("convert", small_dcp, tmp_path / "out", "--to", "safetensors").usage_error("truncated")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_existing_destination_and_destination_inside_source_exit_2(cli_run, small_dcp, tmp_path):
    (tmp_path / "taken").mkdir()
    cli_run("convert", small_dcp, tmp_path / "taken", "--to", "safetensors").usage_error(
        "already exists"
    )
    cli_run("convert", small_dcp, small_dcp / "inner", "--to", "safetensors").usage_error(
        "inside the source"
    )
    assert not (small_dcp / "inner").exists()
    cli_run(
        "convert", small_dcp, tmp_path / "x", "--to", "full", "--max-shard-size", "1GB"
    ).usage_error("--max-shard-size")
    cli_run("convert", small_dcp, tmp_path / "x").usage_error("--to is required")
    cli_run(
        "convert", small_dcp, tmp_path / "x", "--to", "safetensors", "--max-shard-size", "lots"
    ).usage_error("not a size")


def test_full_disk_exit_2_nothing_left(tied_bin, tmp_path):
    """A real write error from the kernel: the file-size limit (RLIMIT_FSIZE) makes write() fail with EFBIG, as a
    full disk fails it with ENOSPC. Exit 2, one line, no DST, no temporary folder."""
    import resource
    import signal

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    proc = subprocess.run(
        [*CLI, "convert", str(tied_bin), str(tmp_path / "out"), "--to", "safetensors"],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
        preexec_fn=limit,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "cannot write" in proc.stderr
    assert "nothing left at the destination" in proc.stderr
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_enospc_in_process_exit_2_nothing_left(cli_run, tied_bin, tmp_path, monkeypatch):
    import errno

    from checkpoint_strategy.convert import writers

    real = writers._create

    class Full:
        def __init__(self, fh):
            self.fh, self.closed = fh, False

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device", self.fh.name)

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def close(self):
            self.closed = True
            self.fh.close()

    monkeypatch.setattr(writers, "_create", lambda path: Full(real(path)))
    line = cli_run("convert", tied_bin, tmp_path / "out", "--to", "safetensors").usage_error(
        "no space left"
    )
    assert "nothing left" in line
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_a_failed_check_writes_nothing_and_exits_1(cli_run, tied_bin, tmp_path, monkeypatch):
    """A write that silently changes bytes (a bad disk, a bug) is caught by the read-back check before the rename."""
    from checkpoint_strategy.convert import writers

    real = writers._Copier.copy

    def corrupt(self, t, write):
        def flip(chunk):
            data = bytearray(chunk)
            if t.name == "transformer.wte.weight":
                data[0] ^= 1
            write(bytes(data))

        real(self, t, flip)

    monkeypatch.setattr(writers._Copier, "copy", corrupt)
    r = cli_run("convert", tied_bin, tmp_path / "out", "--to", "safetensors", "--format", "json")
    report = r.json()
    assert r.rc == 1 and not report["written"] and not report["check"]["ok"]
    bad = {
        row["name"]: row["status"] for row in report["check"]["rows"] if row["status"] != "equal"
    }
    assert bad == {"transformer.wte.weight": "bytes differ", "lm_head.weight": "bytes differ"}
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_names_with_newlines_cannot_forge_report_lines(cli_run, tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"ok\nForged line | x": torch.zeros(2)}, path)
    r = cli_run("convert", path, tmp_path / "out", "--to", "safetensors")
    assert r.rc == 0, r.err
    assert not any(line.startswith("Forged") for line in r.out.splitlines())
    assert list(_load_st(tmp_path / "out")) == ["ok\nForged line | x"]


def test_text_and_markdown_reports_render(cli_run, tied_bin, tmp_path):
    r = cli_run("convert", tied_bin, tmp_path / "st", "--to", "safetensors")
    assert "Check:        PASS: 5 of 6 source tensors equal" in r.out
    assert "tied          float32    [64, 32]" in r.out
    assert f"checkpoint-strategy validate {tmp_path / 'st'} --level deep" in r.out
    r = cli_run("convert", tied_bin, tmp_path / "st", "--check-only", "--format", "markdown")
    assert r.rc == 0 and "| tied | float32 | [64, 32] |" in r.out


def test_module_never_imports_torch(tmp_path):
    code = (
        "import sys; from checkpoint_strategy.convert import core, zero, writers, readers; "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=checkout_env(), timeout=60
    )
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.parametrize(
    "text, value",
    [
        ("5GB", 5 * 10**9),
        ("500MB", 5 * 10**8),
        ("2GiB", 2 << 30),
        ("1.5kb", 1500),
        ("4096", 4096),
        ("10 MiB", 10 << 20),
    ],
)
def test_max_shard_size_spellings(text, value):
    from checkpoint_strategy.cli.options import byte_size

    assert byte_size(text) == value


@pytest.mark.parametrize("text", ["0", "0.1", "5 GB GB", "-1GB", "1e3", "99999999999EB"])
def test_bad_max_shard_size_exit_2_with_one_line(cli_run, text, tmp_path):
    cli_run(
        "convert", tmp_path, tmp_path / "x", "--to", "safetensors", "--max-shard-size", text
    ).usage_error("--max-shard-size")


_SOURCES: dict[str, bytes] = {}


def _fuzz_source(kind: str) -> bytes:
    """A real torch.save archive (weights + an AdamW state) or safetensors file, built once per process."""
    if kind not in _SOURCES:
        import io

        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 6)).sum().backward()
        opt.step()
        if kind == "torch":
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
            _SOURCES[kind] = buf.getvalue()
        else:
            from safetensors.torch import save

            _SOURCES[kind] = save(dict(model.state_dict()))
    return _SOURCES[kind]


@reaches_core()
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["torch", "safetensors"]),
    target=st.sampled_from(["safetensors", "full", "dcp"]),
    roll=MUTATE,
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3),
    cut=st.integers(0, 10**6),
)
def test_fuzz_damaged_sources_convert_whole_or_not_at_all(
    tmp_path_factory, kind, target, roll, flips, cut
):
    """A real archive, damaged one time in five (byte flips, a cut): exit 0 with a whole, checked DST, or exit 2 with
    one line and nothing at DST; never 3."""
    from cliresult import run_captured

    tmp = tmp_path_factory.mktemp("fuzz")
    data = bytearray(_fuzz_source(kind))
    if roll[0] >= 16:
        for at, x in flips:
            data[at % len(data)] ^= x
        if roll[0] == 19:
            data = data[: cut % len(data)]
    src = tmp / ("m.pt" if kind == "torch" else "m.safetensors")
    src.write_bytes(bytes(data))
    dst = tmp / ("out.pt" if target == "full" else "out")
    r = run_captured(["convert", str(src), str(dst), "--to", target, "--format", "json"])
    assert r.rc in (0, 1, 2), r.err
    if reached(r.rc == 0):
        report = json.loads(r.out)
        assert report["check"]["ok"] and report["written"] and dst.exists()
    else:
        assert not dst.exists() and _leftovers(tmp) == []
        if r.rc == 2:
            assert len(r.err.strip().splitlines()) == 1 and r.out == ""


def test_leftover_of_an_interrupted_conversion_is_named_and_never_used(
    cli_run, small_dcp, tmp_path
):
    """kill -9 mid-write leaves .DST.convert-XXXX (never DST): the next run says so and writes a fresh one."""
    (tmp_path / ".out.convert-dead1234").mkdir()
    (tmp_path / ".out.convert-dead1234" / "model.safetensors").write_bytes(b"half")
    r = cli_run("convert", small_dcp, tmp_path / "out", "--to", "safetensors", "--format", "json")
    assert r.rc == 0 and any(
        ".out.convert-dead1234" in n and "interrupted" in n for n in r.json()["notes"]
    )
    assert (tmp_path / "out" / "model.safetensors").stat().st_size > 4


def test_fifo_as_dcp_data_file_exit_2_without_blocking(cli_run, small_dcp, tmp_path):
    os.unlink(small_dcp / "__0_0.distcp")
    os.mkfifo(small_dcp / "__0_0.distcp")
    cli_run("convert", small_dcp, tmp_path / "out.pt", "--to", "full").usage_error("FIFO")
    assert not (tmp_path / "out.pt").exists() and _leftovers(tmp_path) == []


def test_key_selects_a_subtree_and_a_missing_key_exit_2(cli_run, small_dcp, tmp_path):
    r = cli_run("convert", small_dcp, tmp_path / "m.pt", "--to", "full", "--key", "model")
    assert r.rc == 0, r.err
    assert list(torch.load(tmp_path / "m.pt", weights_only=True)) == ["w"]
    cli_run(
        "convert", small_dcp, tmp_path / "x", "--to", "safetensors", "--key", "nope"
    ).usage_error("--key nope: no such entry")


def test_torchtitan_flat_state_to_safetensors_keeps_the_model_fqns_only(
    cli_run, torchtitan_layout, tmp_path
):
    """torchtitan saves model FQNs at the top next to optimizer, lr_scheduler, dataloader, train_state."""
    import torch.distributed.checkpoint as dcp

    r = cli_run(
        "convert",
        torchtitan_layout / "step-10",
        tmp_path / "st",
        "--to",
        "safetensors",
        "--format",
        "json",
    )
    report = r.json()
    assert r.rc == 0, r.err
    got = _load_st(tmp_path / "st")
    assert sorted(got) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(
        k in report["left_out"][-1]
        for k in ("optimizer", "lr_scheduler", "dataloader", "train_state")
    )
    target = {k: torch.zeros_like(v) for k, v in got.items()}
    dcp.load(target, checkpoint_id=str(torchtitan_layout / "step-10"))
    assert all(torch.equal(target[k], got[k]) for k in got)


def test_kill_9_mid_conversion_never_leaves_a_partial_destination(tmp_path):
    """SIGKILL at some point of the write: DST is either absent or whole (the rename is the last step)."""
    import signal
    import time

    torch.save(
        {f"w{i}": torch.full((4 << 20,), float(i)) for i in range(8)}, tmp_path / "big.pt"
    )  # 128 MB
    dst = tmp_path / "out"
    proc = subprocess.Popen(
        [*CLI, "convert", str(tmp_path / "big.pt"), str(dst), "--to", "safetensors"],
        env=checkout_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _leftovers(tmp_path) and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    if dst.exists():  # it finished before the kill: then it is whole
        got = _load_st(dst)
        assert sorted(got) == [f"w{i}" for i in range(8)]
    else:
        assert _leftovers(tmp_path), "killed before it started?"


def test_a_file_name_for_a_folder_target_exit_2(cli_run, small_dcp, tmp_path):
    cli_run("convert", small_dcp, tmp_path / "w.safetensors", "--to", "safetensors").usage_error(
        "writes a folder"
    )
    assert not (tmp_path / "w.safetensors").exists()
