"""recovery/verify.py: the jump/drop band at its edge, through the API and the command line (issue 18)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from checkpoint_strategy.recovery.verify import verify_resume

LEVEL = 2.0


def _log(tmp_path, jump: float):
    """200 steps at LEVEL +- 0.1 % (alternating), the loss after step 100 `jump` x LEVEL higher."""
    y = LEVEL * (1 + 0.001 * np.where(np.arange(200) % 2, -1.0, 1.0))
    y[100:] += jump * LEVEL
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join(json.dumps({"step": i + 1, "loss": float(v)}) for i, v in enumerate(y)))
    return p


# band = max(5 % x pre level, 3 standard errors); the noise here is 0.1 %, so the band is 5 % x 2.0 = 0.1
@pytest.mark.parametrize(
    "jump, verdict",
    [(0.07, "suspicious"), (0.10, "suspicious"), (0.03, "ok"), (-0.07, "suspicious")],
)
def test_jump_of_seven_to_ten_percent_is_suspicious_by_the_api(tmp_path, jump, verdict):
    r = verify_resume(str(_log(tmp_path, jump)), 100)
    assert r.band == pytest.approx(0.05 * LEVEL, rel=1e-6)
    assert r.verdict == verdict
    assert (r.jump, r.drop) == ((jump > 0.05), (jump < -0.05))


@pytest.mark.parametrize("jump, rc", [(0.07, 1), (0.10, 1), (0.03, 0)])
def test_jump_of_seven_to_ten_percent_exits_1_on_the_command_line(tmp_path, cli_run, jump, rc):
    r = cli_run("verify-resume", _log(tmp_path, jump), "--resume-step", 100, "--format", "json")
    assert r.rc == rc
    out = r.json()
    assert out["band"] == pytest.approx(0.05 * LEVEL, rel=1e-6)
    assert out["jump"] is (rc == 1)
