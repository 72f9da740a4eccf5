"""The loop-closure CLI end to end on the shared tiny checkpoint (2 eval clips): loops with the
co-visibility probe and figures; palindromes under two memories."""

import json

import numpy as np


def test_loop_closure_cli(tiny_checkpoint, tmp_path, capsys):
  from jaxwm.evaluation import loop_closure  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  out = tmp_path / "lc"
  assert loop_closure.main(["--checkpoint", str(workdir), "--clips", "2", "--steps", "2", "--out", str(out),
                            "--probe", "--figures"]) == 0
  (rows,) = json.loads(out.with_suffix(".json").read_text())["settings"].values()
  assert len(rows) == 2 and all(np.isfinite(r["psnr"]) and 0 <= r["ssim"] <= 1 for r in rows)
  assert all("return_psnr" in r and 0 <= r["covis_chance"] <= 1 and 0 <= r["covis_mass"] <= 1 for r in rows)
  md = out.with_suffix(".md").read_text()
  assert "| magnitude | clips |" in md and "| axes | clips |" in md and "covis_mass" in md
  assert (tmp_path / "lc_return_ssim.png").exists() and list(tmp_path.glob("lc_*_attention.png"))
  assert "LPIPS skipped" in capsys.readouterr().out


def test_palindrome_revisits_under_bounded_memory(tiny_checkpoint, tmp_path):
  from jaxwm.evaluation import loop_closure  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  out = tmp_path / "pal"
  assert loop_closure.main(["--checkpoint", str(workdir), "--clips", "1", "--steps", "2", "--out", str(out),
                            "--family", "palindrome", "--memory", "full,window", "--frames", "9",
                            "--memory-kwargs", '{"window": {"window": 4}}']) == 0
  settings = json.loads(out.with_suffix(".json").read_text())["settings"]
  full, window = settings["memory=full"][0], settings["memory=window"][0]
  assert [(p["t"], p["mirror"]) for p in full["pairs"]] == [(0, 8), (1, 7)]
  assert full["needle_resident"] == 1.0 and window["needle_resident"] == 0.0  # sink + 4 evicts frame 1
  assert -1 <= window["revisit_ssim"] <= 1
