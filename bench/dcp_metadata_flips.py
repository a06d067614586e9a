"""Every byte of a real dcp.save .metadata flipped (bit `at % 8`, the .metadata of tests/test_convert_verified.py's
dcp_folder): convert's and `validate --level full`'s verdicts against torch's own dcp_to_torch_save. Prints each
flip torch refuses that convert wrote (LAUNDER) or validate called valid (VALIDATE-MISS), each exit 3 (CRASH), and
the counts (docs/convert.md).

    python bench/dcp_metadata_flips.py WORKDIR [--scripts PATH]
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(
    0,
    sys.argv[sys.argv.index("--scripts") + 1] if "--scripts" in sys.argv else str(ROOT / "scripts"),
)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from cliresult import run_captured  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

from checkpoint_strategy.validate.engine import validate_checkpoint  # noqa: E402


def build(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    torch.manual_seed(0)
    folder = root / "step-1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {
                "model": {"w": torch.randn(4, 4), "b": torch.randn(4)},
                "opt": {"lr": 0.1, "ids": [1, 2]},
            },
            checkpoint_id=str(folder),
        )
    return folder


def torch_refuses(src: Path, out: Path) -> str | None:
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            dcp_to_torch_save(str(src), str(out))
        return None
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(exc, KeyboardInterrupt):
            raise
        return str(exc)[-200:]


def main() -> int:
    root = Path(sys.argv[1])
    folder = build(root)
    raw = (folder / ".metadata").read_bytes()
    launder = crash = conv = vmiss = 0
    for at in range(len(raw)):
        src = root / "flip"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(folder, src)
        data = bytearray(raw)
        data[at] ^= 1 << (at % 8)
        (src / ".metadata").write_bytes(bytes(data))
        r = run_captured(["convert", str(src), str(root / "out.pt"), "--to", "full"])
        (root / "out.pt").unlink(missing_ok=True)
        if r.rc not in (0, 1, 2):
            crash += 1
            print("CRASH", at, r.err[-200:])
        ref = torch_refuses(src, root / "ref.pt")
        if ref is not None and validate_checkpoint(src, "full").status not in (
            "invalid",
            "incomplete",
        ):
            vmiss += 1
            print("VALIDATE-MISS", at, ref[-120:])
        if r.rc == 0:
            conv += 1
            if ref is not None:
                launder += 1
                print("LAUNDER", at, ref[-150:])
    print(
        f"{len(raw)} flips: converted {conv}, converted though torch refuses {launder}, validate full valid "
        f"though torch refuses {vmiss}, exit 3 {crash}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
