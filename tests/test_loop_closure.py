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
  # Removing the return frame's mean colour offset can only lower its error.
  assert all(r["return_psnr_offset_free"] >= r["return_psnr"] - 1e-4 and len(r["return_offset_rgb"]) == 3
             and abs(r["return_offset"] - np.mean(r["return_offset_rgb"])) < 1e-9 for r in rows)
  md = out.with_suffix(".md").read_text()
  assert "| magnitude | clips |" in md and "| axes | clips |" in md and "covis_mass" in md
  assert "return_psnr_offset_free" in md
  assert (tmp_path / "lc_return_ssim.png").exists() and list(tmp_path.glob("lc_*_attention.png"))
  assert "LPIPS skipped" in capsys.readouterr().out
  # Co-visible score: the yaw-30 and yaw-45 loops keep part of the first view in sight on every in-between frame.
  for r in rows:
    assert r["covis_frames"] == len(r["covis_per_frame"]) == r["return_frame"] - 1
    # 16x16 frames rendered at 16x16: the bilinear warp is coarse, still far above the baselines.
    assert r["warp_covis_psnr"] > max(r["copy_covis_psnr"], r["mean_covis_psnr"]) + 5
    assert r["covis_psnr"] < r["warp_covis_psnr"]
    assert 0 < r["covis_fraction"] < 1 and r["revealed_psnr"] is not None
  assert "co-visible PSNR" in md and "warp_covis_psnr" in md


def test_walks_family_is_scored_on_every_generated_frame(tiny_checkpoint, tmp_path):
  from jaxwm.data.procedural.trajectories import WALKS  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation import loop_closure  # pylint: disable=g-import-not-at-top
  workdir, c, _ = tiny_checkpoint
  out = tmp_path / "walks"
  assert loop_closure.main(["--checkpoint", str(workdir), "--clips", "5", "--steps", "1", "--out", str(out),
                            "--family", "walks", "--split", "train"]) == 0
  data = json.loads(out.with_suffix(".json").read_text())
  (rows,) = data["settings"].values()
  assert data["split"] == "train" and [r["family"] for r in rows] == list(WALKS)
  assert all(len(r["covis_per_frame"]) == c.data.num_frames - 1 and r["covis_frames"] >= 1 for r in rows)
  md = out.with_suffix(".md").read_text()
  assert "| family | clips |" in md and "training rooms" in md and "co-visible PSNR" in md


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


def test_figures_from_rows(tmp_path):
  """Figures from hand-made rows: one line per setting, attention and selection maps of a sparse probe."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation import loop_closure  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  probe = {"key_frames": [0, 1, 2, 1, 2], "history": [True, True, False, False, False],
           "mass_per_frame": rng.random((2, 5)).tolist(), "selected": [[1], [0]]}
  results = {name: [{"magnitude": m, "return_ssim": float(rng.random()), "return_psnr": 10 + m / 30,
                     **({"probe_frames": probe} if m == 30 else {})} for m in (30, 90, 180) for _ in range(2)]
             for name in ("a", "b")}
  paths = loop_closure.figures(str(tmp_path / "f"), results, "loops")
  names = sorted(p.split("/")[-1] for p in paths)
  assert names == ["f_a_attention.png", "f_a_selection.png", "f_b_attention.png", "f_b_selection.png",
                   "f_return_psnr.png", "f_return_ssim.png"]
  assert Image.open(tmp_path / "f_return_ssim.png").size == (560, 360)
  sel = np.asarray(Image.open(tmp_path / "f_a_selection.png"))
  assert (sel == [230, 50, 40]).all(-1).any()  # the selected frames are drawn red
