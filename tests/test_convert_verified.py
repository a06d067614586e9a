"""`convert` copies only verified bytes (issue 40): every break the attack found, as a test.

Each destination is read back here with the target's own reader (torch.load(weights_only=True) for --to full,
dcp_to_torch_save for --to dcp, safetensors.safe_open for --to safetensors) and compared with torch.load of the
source; bad input exits 2 with one line and leaves nothing at DST.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".convert-" in p.name]


def _st(folder: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out


def _dcp_full(folder: Path, tmp: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{folder.name}-read.pt"
    dcp_to_torch_save(str(folder), str(out))
    return torch.load(out, weights_only=True)


def _same(a, b) -> bool:
    """Equal trees: tensors by dtype, shape and bytes (NaN-safe), everything else by ==."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(
                a.view(torch.uint8) if a.numel() and a.dtype.itemsize == 1 else a,
                b.view(torch.uint8) if b.numel() and b.dtype.itemsize == 1 else b,
            )
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def _convert_all(cli_run, src: Path, tmp: Path) -> dict:
    """src converted to the three targets, each read back by its own reader: target -> what it loads."""
    out = {}
    for target, dst in (
        ("full", tmp / "out.pt"),
        ("safetensors", tmp / "out-st"),
        ("dcp", tmp / "out-dcp"),
    ):
        r = cli_run("convert", src, dst, "--to", target, "--format", "json")
        report = r.json()
        assert r.rc == 0 and report["check"]["ok"] and report["written"], (
            target,
            r.err,
            report["check"],
        )
        out[target] = (
            torch.load(dst, weights_only=True)
            if target == "full"
            else _st(dst)
            if target == "safetensors"
            else _dcp_full(dst, tmp)
        )
    return out


# --------------------------------------------------------------------------- CRC-32 of every entry read


def _data_offset(path: Path, suffix: str) -> int:
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    with open(path, "rb") as fh:
        fh.seek(info.header_offset + 26)
        nlen, xlen = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
    return info.header_offset + 30 + nlen + xlen


def _flip(path: Path, at: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= mask
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("target", ["full", "safetensors", "dcp"])
def test_a_source_full_calls_invalid_is_refused_by_its_crc(cli_run, tmp_path, target):
    """One low mantissa bit of a weight flipped: the value stays finite (only the CRC knows), torch.load still
    reads it, validate --level full calls it invalid: convert refuses it (exit 2, one line), nothing written."""
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(64), "b": torch.zeros(4)}, src)
    _flip(src, _data_offset(src, "data/0"))
    assert torch.isfinite(torch.load(src, weights_only=True)["w"]).all()
    assert cli_run("validate", src, "--level", "full").rc == 1
    dst = tmp_path / ("out.pt" if target == "full" else "out")
    line = cli_run("convert", src, dst, "--to", target).usage_error("CRC-32 mismatch")
    assert "data/0" in line
    assert not dst.exists() and _leftovers(tmp_path) == []


def test_a_dcp_chunk_with_a_flipped_bit_is_refused_by_its_crc(cli_run, tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "step-1"
    dcp.save({"model": {"w": torch.ones(16, 4)}}, checkpoint_id=str(folder))
    data = folder / "__0_0.distcp"
    raw = data.read_bytes()
    at = raw.index(
        b"\x00\x00\x80\x3f" * 4
    )  # the stored 1.0s of w, inside the embedded archive's data/0
    _flip(data, at)
    line = cli_run("convert", folder, tmp_path / "out.pt", "--to", "full").usage_error(
        "CRC-32 mismatch"
    )
    assert "model.w" in line and not (tmp_path / "out.pt").exists()


# --------------------------------------------------------------------------- byte order


def _big_endian_copy(src: Path, dst: Path, widths: list[int]) -> None:
    """The torch.save archive src rewritten as a big-endian machine saves it: each data/N swapped per element
    (widths[N] bytes), byteorder record "big" (torch.load swaps back)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            name = info.filename.split("/", 1)[1]
            if name == "byteorder":
                data = b"big"
            elif name.startswith("data/") and widths[int(name[5:])] > 1:
                w = widths[int(name[5:])]
                data = b"".join(data[i : i + w][::-1] for i in range(0, len(data), w))
            zout.writestr(info.filename, data)


def test_a_big_endian_archive_converts_to_what_torch_load_reads(cli_run, tmp_path):
    torch.manual_seed(0)
    state = {
        "w": torch.randn(8, 4),
        "h": torch.randn(6).to(torch.bfloat16),
        "ids": torch.arange(5),
        "c": torch.randn(3, dtype=torch.complex64),
        "d": torch.randn(2, dtype=torch.float64),
        "mask": torch.tensor([True, False]),
    }
    little = tmp_path / "little.pt"
    torch.save(state, little)
    src = tmp_path / "big.pt"
    _big_endian_copy(
        little, src, [4, 2, 8, 4, 8, 1]
    )  # complex64: each float32 half swapped on its own
    expected = torch.load(src, weights_only=True)
    assert _same(expected, state)  # torch reads the big-endian copy right
    for target, got in _convert_all(cli_run, src, tmp_path).items():
        assert _same(got, expected), target
    report = cli_run(
        "convert", src, tmp_path / "again.pt", "--to", "full", "--format", "json"
    ).json()
    assert any("big-endian" in n for n in report["notes"])


def test_an_unknown_byteorder_record_is_refused_as_torch_refuses_it(cli_run, tmp_path):
    little = tmp_path / "little.pt"
    torch.save({"w": torch.ones(3)}, little)
    src = tmp_path / "odd.pt"
    with zipfile.ZipFile(little) as zin, zipfile.ZipFile(src, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(
                info.filename, b"middle" if info.filename.endswith("byteorder") else zin.read(info)
            )
    with pytest.raises(Exception, match="(?i)endian"):
        torch.load(src, weights_only=True)
    cli_run("convert", src, tmp_path / "out.pt", "--to", "full").usage_error("byteorder")


# --------------------------------------------------------------------------- every key kept or listed


def test_tensors_under_tuple_none_float_and_bool_keys_are_all_kept(cli_run, tmp_path):
    torch.manual_seed(0)
    state = {
        "w": torch.randn(3),
        ("a", 1): torch.randn(2),
        None: torch.randn(4),
        1.5: torch.randn(1),
        True: torch.randn(2),
        7: {"inner": torch.randn(2)},
    }
    src = tmp_path / "keys.pt"
    torch.save(state, src)
    got = _convert_all(cli_run, src, tmp_path)
    assert _same(got["full"], torch.load(src, weights_only=True))  # every key as itself
    # safetensors and DCP name entries by str(key), as dcp.save does: every tensor is there
    named = {
        "w": state["w"],
        "('a', 1)": state[("a", 1)],
        "None": state[None],
        "1.5": state[1.5],
        "True": state[True],
        "7.inner": state[7]["inner"],
    }
    assert _same(got["safetensors"], named)
    dcp_flat = got["dcp"]
    assert _same(
        {**{k: v for k, v in dcp_flat.items() if k != "7"}, "7.inner": dcp_flat["7"]["inner"]},
        named,
    )


def test_a_key_that_is_an_object_is_listed_under_left_out(cli_run, tmp_path):
    src = tmp_path / "objkey.pt"
    torch.save({"w": torch.ones(2), torch.float32: torch.zeros(2)}, src)
    r = cli_run("convert", src, tmp_path / "out.pt", "--to", "full", "--format", "json")
    report = r.json()
    assert r.rc == 0 and report["check"]["ok"]
    assert any("key" in item and "float32" in item for item in report["left_out"]), report[
        "left_out"
    ]
    assert set(torch.load(tmp_path / "out.pt", weights_only=True)) == {"w"}


def test_keys_that_join_to_one_name_are_refused_by_name(cli_run, tmp_path):
    src = tmp_path / "twice.pt"
    torch.save({1: torch.ones(2), "1": torch.zeros(2)}, src)
    for target, dst in (("full", "out.pt"), ("dcp", "out-dcp"), ("safetensors", "out-st")):
        line = cli_run("convert", src, tmp_path / dst, "--to", target).usage_error("both named")
        assert "1" in line and not (tmp_path / dst).exists()


# --------------------------------------------------------------------------- DeepSpeed name collisions


def _zero2_folder(
    root: Path, buffer_names: list, shared: dict, module_extra: dict | None = None
) -> Path:
    """A world-1 ZeRO-2 global_stepN/ as DeepSpeed lays it out (torch.save'd dicts of the same keys)."""
    torch.manual_seed(0)
    folder = root / "global_step1"
    folder.mkdir(parents=True)
    shapes = {"w": torch.Size([4, 2]), "b": torch.Size([2])}
    fp32 = torch.randn(10)
    module = {
        "w": fp32[:8].view(4, 2).half(),
        "b": fp32[8:].half(),
        "norm.running_mean": torch.ones(2),
        **(module_extra or {}),
    }
    cfg = {"zero_optimization": {"stage": 2}}
    torch.save(
        {
            "module": module,
            "buffer_names": buffer_names,
            "param_shapes": [shapes],
            "shared_params": shared,
            "frozen_param_shapes": None,
            "ds_config": cfg,
        },
        folder / "mp_rank_00_model_states.pt",
    )
    osd = {
        "single_partition_of_fp32_groups": [fp32],
        "partition_count": [1],
        "param_alignment_paddings": [[0, 0]],
        "base_optimizer_state": {
            "state": {
                0: {
                    "exp_avg": torch.randn(10),
                    "exp_avg_sq": torch.rand(10),
                    "step": torch.tensor(3.0),
                }
            },
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}],
        },
    }
    torch.save(
        {"optimizer_state_dict": osd, "ds_config": cfg},
        folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
    )
    return folder


def test_zero_folder_converts_with_its_buffer_and_shared_name(cli_run, tmp_path):
    folder = _zero2_folder(tmp_path, ["norm.running_mean"], {"lm_head.weight": "w"})
    r = cli_run("convert", folder, tmp_path / "out.pt", "--to", "full", "--format", "json")
    assert r.rc == 0 and r.json()["check"]["ok"], r.err
    model = torch.load(tmp_path / "out.pt", weights_only=True)["model"]
    assert set(model) == {"w", "b", "norm.running_mean", "lm_head.weight"}
    assert torch.equal(model["lm_head.weight"], model["w"])


@pytest.mark.parametrize(
    "buffers, shared",
    [(["w"], {}), ([], {"b": "w"}), (["norm.running_mean"], {"norm.running_mean": "w"})],
    ids=["buffer-over-parameter", "shared-over-parameter", "shared-over-buffer"],
)
def test_zero_name_collision_is_refused_by_name(cli_run, tmp_path, buffers, shared):
    folder = _zero2_folder(tmp_path, buffers, shared)
    for target, dst in (("full", "out.pt"), ("safetensors", "out-st")):
        line = cli_run("convert", folder, tmp_path / dst, "--to", target).usage_error(
            "one would replace the other"
        )
        assert (buffers or list(shared))[0] in line and not (tmp_path / dst).exists()


# --------------------------------------------------------------------------- what DCP reads


def test_a_list_at_the_top_is_refused_for_dcp_and_kept_by_full(cli_run, tmp_path):
    src = tmp_path / "list.pt"
    torch.save([torch.ones(2), {"a": torch.zeros(3)}], src)
    cli_run("convert", src, tmp_path / "out-dcp", "--to", "dcp").usage_error(
        "not a mapping of names"
    )
    assert not (tmp_path / "out-dcp").exists() and _leftovers(tmp_path) == []
    assert cli_run("convert", src, tmp_path / "out.pt", "--to", "full").rc == 0
    assert _same(
        torch.load(tmp_path / "out.pt", weights_only=True), torch.load(src, weights_only=True)
    )


def test_a_tuple_of_tensors_is_refused_for_dcp_by_name(cli_run, tmp_path):
    src = tmp_path / "tuple.pt"
    torch.save({"pair": (torch.ones(2), torch.zeros(2)), "w": torch.ones(1)}, src)
    cli_run("convert", src, tmp_path / "out-dcp", "--to", "dcp").usage_error("pair")
    assert cli_run("convert", src, tmp_path / "out.pt", "--to", "full").rc == 0
    assert _same(
        torch.load(tmp_path / "out.pt", weights_only=True), torch.load(src, weights_only=True)
    )


# --------------------------------------------------------------------------- optimizers with any moments


def _lion_state(params) -> dict:
    """lion-pytorch's state: exp_avg only, no step."""
    return {
        "state": {i: {"exp_avg": torch.randn_like(p)} for i, p in enumerate(params)},
        "param_groups": [
            {
                "lr": 1e-4,
                "betas": (0.9, 0.99),
                "weight_decay": 0.0,
                "params": list(range(len(params))),
            }
        ],
    }


@pytest.mark.parametrize("kind", ["lion", "sgd-momentum", "adafactor", "adam"])
def test_optimizers_with_any_subset_of_moments_convert_and_load(cli_run, tmp_path, kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    if kind == "lion":
        opt_state = _lion_state(list(model.parameters()))
    else:
        opt = {
            "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adafactor": lambda p: torch.optim.Adafactor(p, lr=0.01),
            "adam": lambda p: torch.optim.Adam(p, lr=0.01),
        }[kind](model.parameters())
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        opt_state = opt.state_dict()
    src = tmp_path / "run.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt_state}, src)
    expected = torch.load(src, weights_only=True)
    for target, dst in (("full", tmp_path / "out.pt"), ("dcp", tmp_path / "out-dcp")):
        r = cli_run("convert", src, dst, "--to", target, "--format", "json")
        report = r.json()
        assert r.rc == 0 and report["check"]["ok"], (target, report["check"]["optimizer"])
        assert report["check"]["optimizer"]["complete"]
        got = torch.load(dst, weights_only=True) if target == "full" else _dcp_full(dst, tmp_path)
        state = {int(k): v for k, v in got["optimizer"]["state"].items()}
        assert _same(state, {int(k): v for k, v in expected["optimizer"]["state"].items()}), target
    if kind != "lion":  # the full archive resumes: the optimizer loads the converted state
        opt.load_state_dict(torch.load(tmp_path / "out.pt", weights_only=True)["optimizer"])


# --------------------------------------------------------------------------- zero-size tensors


def test_a_zero_size_tensor_is_converted_not_called_a_view(cli_run, tmp_path):
    src = tmp_path / "empty.pt"
    torch.save({"z": torch.zeros(3, 0, 2), "t": torch.zeros(0, 5).t(), "w": torch.ones(2)}, src)
    expected = torch.load(src, weights_only=True)
    for target, got in _convert_all(cli_run, src, tmp_path).items():
        assert {k: tuple(v.shape) for k, v in got.items()} == {
            k: tuple(v.shape) for k, v in expected.items()
        }, target
        assert torch.equal(got["w"], expected["w"])


# --------------------------------------------------------------------------- the destination's name, the next step


def test_full_needs_a_suffix_validate_reads_and_the_printed_next_step_runs(cli_run, tmp_path):
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2)}, src)
    for bad in ("out", "out.bin", "out/"):
        line = cli_run("convert", src, str(tmp_path / bad), "--to", "full").usage_error(
            ".pt, .pth or .ckpt"
        )
        assert ".convert-" not in line
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
    for name in ("out.pt", "out.pth", "out.ckpt"):
        report = cli_run("convert", src, tmp_path / name, "--to", "full", "--format", "json").json()
        (step,) = report["next_steps"]
        argv = step.split()
        assert argv[:2] == ["checkpoint-strategy", "validate"]
        assert cli_run(*argv[1:]).rc == 0, step


def test_a_folder_target_named_with_a_slash_is_written(cli_run, tmp_path):
    src = tmp_path / "m.pt"
    torch.save({"model": {"w": torch.ones(2)}}, src)
    assert cli_run("convert", src, f"{tmp_path / 'out-dcp'}/", "--to", "dcp").rc == 0
    assert torch.equal(_dcp_full(tmp_path / "out-dcp", tmp_path)["model"]["w"], torch.ones(2))


# --------------------------------------------------------------------------- one line, short


def test_error_lines_are_cut_to_300_characters(cli_run, tmp_path):
    deep = tmp_path / ("a" * 200) / ("b" * 200) / "m.pt"
    line = cli_run("convert", deep, tmp_path / "out.pt", "--to", "full").usage_error("source")
    assert len(line) <= 300 + len("checkpoint-strategy: error: ") and "characters, cut" in line


@pytest.mark.parametrize("url", ["s3://bucket/run/checkpoint-10", "gs://b/x.pt", "memory://m/x.pt"])
def test_a_url_source_or_destination_is_refused_in_one_line(cli_run, tmp_path, url):
    cli_run("convert", url, tmp_path / "out.pt", "--to", "full").usage_error(
        "local files and folders only"
    )
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2)}, src)
    cli_run("convert", src, url, "--to", "full").usage_error("local files and folders only")


# --------------------------------------------------------------------------- one symlink rule


def test_an_index_naming_a_symlink_out_of_the_folder_is_refused(cli_run, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    torch.save({"w": torch.ones(2)}, outside / "secret.bin")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "pytorch_model-00001-of-00001.bin").symlink_to(outside / "secret.bin")
    (folder / "pytorch_model.bin.index.json").write_text(
        '{"metadata": {}, "weight_map": {"w": "pytorch_model-00001-of-00001.bin"}}'
    )
    cli_run("convert", folder, tmp_path / "out-st", "--to", "safetensors").usage_error(
        "resolves outside"
    )
    # the same file linked from inside the folder is read
    (folder / "pytorch_model-00001-of-00001.bin").unlink()
    os.link(outside / "secret.bin", folder / "real.bin")
    (folder / "pytorch_model-00001-of-00001.bin").symlink_to("real.bin")
    assert cli_run("convert", folder, tmp_path / "out-st", "--to", "safetensors").rc == 0


def test_a_single_weights_file_linked_out_of_the_folder_is_refused(cli_run, tmp_path):
    outside = tmp_path / "elsewhere.bin"
    torch.save({"w": torch.ones(2)}, outside)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "pytorch_model.bin").symlink_to(outside)
    cli_run("convert", folder, tmp_path / "out-st", "--to", "safetensors").usage_error(
        "resolves outside"
    )


def test_a_zero_latest_tag_linked_out_of_the_folder_is_refused(cli_run, tmp_path):
    real = _zero2_folder(tmp_path / "other-run", ["norm.running_mean"], {})
    run = tmp_path / "run"
    run.mkdir()
    (run / "global_step1").symlink_to(real, target_is_directory=True)
    (run / "latest").write_text("global_step1")
    cli_run("convert", run, tmp_path / "out.pt", "--to", "full").usage_error("resolves outside")
    assert (
        cli_run("convert", real, tmp_path / "out.pt", "--to", "full").rc == 0
    )  # the folder itself converts


# --------------------------------------------------------------------------- bounded .metadata


@pytest.fixture
def dcp_folder(tmp_path) -> Path:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    folder = tmp_path / "step-1"
    dcp.save(
        {"model": {"w": torch.randn(4, 4), "b": torch.randn(4)}, "opt": {"lr": 0.1, "ids": [1, 2]}},
        checkpoint_id=str(folder),
    )
    return folder


def _edit_metadata(folder: Path, edit) -> None:
    with open(folder / ".metadata", "rb") as fh:
        meta = pickle.load(fh)  # a test may unpickle: the file is the one dcp.save just wrote
    edit(meta)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


def _planner(fqn: str, path: tuple):
    def edit(meta) -> None:
        meta.planner_data[fqn] = path

    return edit


@pytest.mark.parametrize(
    "edit, match",
    [
        (_planner("model.w", ("model", 10**10)), "list index outside"),
        (_planner("model.w", ("model", -1)), "list index outside"),
        (_planner("model.b", ("model", "w", "b")), "another name"),
        (_planner("model.b", ("model", "w")), "another name"),
        (_planner("model.w", ("model", "w", 0)), "another name"),
    ],
    ids=["index-10**10", "negative-index", "under-a-tensor", "same-place", "renamed"],
)
def test_planner_data_that_no_folder_holds_exit_2(cli_run, dcp_folder, tmp_path, edit, match):
    _edit_metadata(dcp_folder, edit)
    cli_run("convert", dcp_folder, tmp_path / "out.pt", "--to", "full").usage_error(match)
    assert not (tmp_path / "out.pt").exists() and _leftovers(tmp_path) == []


def test_a_planner_path_under_a_value_or_onto_another_entry_is_refused():
    """dcp.load's set_element on paths whose names agree with their entries but collide (a path through a tensor,
    two entries at one place, a string key into a list)."""
    from checkpoint_strategy.convert import pieces, readers
    from checkpoint_strategy.errors import UsageError

    tree = {"model": {"w": pieces.Tensor("model.w", "float32", (2,))}, "l": [1]}
    for path, match in (
        (("model", "w", "b"), "nests under"),
        (("model", "w"), "two entries"),
        (("l", "x"), "nests under"),
        (("l", 0), "two entries"),
    ):
        with pytest.raises(UsageError, match=match):
            readers._set(tree, path, 1, ".metadata")
    readers._set(tree, ("l", 3), 2, ".metadata")
    assert tree["l"] == [1, None, None, 2]


def _more_chunks(n: int):
    def edit(meta) -> None:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        md = meta.state_dict_metadata["model.w"]
        md.chunks = [
            ChunkStorageMetadata(offsets=torch.Size([i % 4, i // 4]), sizes=torch.Size([1, 1]))
            for i in range(n)
        ]

    return edit


def _size_not_dims(meta) -> None:
    meta.state_dict_metadata["model.w"].size = 16  # a flipped opcode: an int where torch.Size was


def _chunk_past_tensor(meta) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    big = torch.Size([10**12] * 2)
    meta.state_dict_metadata["model.w"].chunks = [
        ChunkStorageMetadata(offsets=big, sizes=torch.Size([4, 4]))
    ]


@pytest.mark.parametrize(
    "edit, match",
    [
        (_more_chunks(3), "no storage_data entry"),
        (
            _more_chunks(40_000),
            "cannot hold",
        ),  # a 4 MB .metadata beside 3 KB of data: refused before it is parsed
        (_size_not_dims, "no valid size"),
        (_chunk_past_tensor, "chunk outside it"),
    ],
    ids=["chunks-without-storage", "40k-chunks", "size-an-int", "chunk-past-the-tensor"],
)
def test_metadata_describing_more_than_the_files_hold_exit_2(
    cli_run, dcp_folder, tmp_path, edit, match
):
    _edit_metadata(dcp_folder, edit)
    line = cli_run("convert", dcp_folder, tmp_path / "out.pt", "--to", "full").usage_error(match)
    assert len(line) < 400
    assert not (tmp_path / "out.pt").exists() and _leftovers(tmp_path) == []


def test_the_dcp_fixture_itself_converts(cli_run, dcp_folder, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(dcp_folder), str(tmp_path / "ref.pt"))
    got = _convert_all(cli_run, dcp_folder, tmp_path)
    assert _same(got["full"], torch.load(tmp_path / "ref.pt", weights_only=True))
    assert _same(got["dcp"], torch.load(tmp_path / "ref.pt", weights_only=True))


@pytest.mark.parametrize("version", [b"99\n", b"0\n", b"11\n", b"x\n"])
def test_a_format_version_torch_refuses_is_refused(cli_run, tmp_path, version):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    src = tmp_path / "v.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(src, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(
                info.filename, version if info.filename.endswith("/version") else zin.read(info)
            )
    with pytest.raises(RuntimeError, match="version"):
        torch.load(src, weights_only=True)
    cli_run("convert", src, tmp_path / "out.pt", "--to", "full").usage_error("format version")
    assert not (tmp_path / "out.pt").exists()


# --------------------------------------------------------------------------- the oracle: dcp_to_torch_save


def _torch_reads(folder: Path, out: Path) -> dict | str:
    import contextlib
    import io
    import warnings

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            dcp_to_torch_save(str(folder), str(out))
        return torch.load(out, weights_only=True)
    except BaseException as exc:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
        if isinstance(exc, KeyboardInterrupt):
            raise
        return str(exc)


def _plain_keys(tree):
    if isinstance(tree, dict):
        return {str(k): _plain_keys(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_plain_keys(v) for v in tree]
    return tree


@pytest.mark.parametrize("name, stride", [(".metadata", 11), ("__0_0.distcp", 61)])
def test_a_flipped_bit_converts_only_to_what_dcp_to_torch_save_reads(
    dcp_folder, tmp_path, name, stride
):
    """One bit flipped every `stride` bytes of a real dcp.save folder (fixed positions): convert exits 0, 1 or 2,
    never 3; and when it writes, torch's own dcp_to_torch_save reads the flipped source and gives exactly what
    convert wrote (convert never launders a checkpoint torch cannot load)."""
    import shutil

    from cliresult import run_captured

    raw = (dcp_folder / name).read_bytes()
    passed = 0
    for at in range(0, len(raw), stride):
        src = tmp_path / f"flip-{at}"
        shutil.copytree(dcp_folder, src)
        data = bytearray(raw)
        data[at] ^= 1 << (at % 8)
        (src / name).write_bytes(bytes(data))
        dst = tmp_path / f"flip-{at}.pt"
        r = run_captured(["convert", str(src), str(dst), "--to", "full"])
        assert r.rc in (0, 1, 2), (at, r.err)
        if r.rc == 0:
            ref = _torch_reads(src, tmp_path / f"ref-{at}.pt")
            assert not isinstance(ref, str), (
                at,
                "convert wrote it, torch refuses the source:",
                ref[-300:],
            )
            assert _same(_plain_keys(torch.load(dst, weights_only=True)), _plain_keys(ref)), at
            passed += 1
        shutil.rmtree(src)
    assert passed
