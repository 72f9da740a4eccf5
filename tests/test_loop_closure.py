"""The loop-closure CLI end to end on the shared tiny checkpoint (2 eval clips)."""

import json

import numpy as np


def test_loop_closure_cli(tiny_checkpoint, tmp_path, capsys):
  from jaxwm.evaluation import loop_closure  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  out = tmp_path / "lc"
  assert loop_closure.main(["--checkpoint", str(workdir), "--clips", "2", "--steps", "2", "--out", str(out),
                            "--memory", "window"]) == 0
  rows = json.loads(out.with_suffix(".json").read_text())["rows"]
  assert len(rows) == 2 and all(np.isfinite(r["psnr"]) and 0 <= r["ssim"] <= 1 for r in rows)
  assert any("return_psnr" in r for r in rows)
  md = out.with_suffix(".md").read_text()
  assert "| magnitude | clips |" in md and "| axes | clips |" in md
  assert "LPIPS skipped" in capsys.readouterr().out
