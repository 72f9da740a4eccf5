"""The trivial baselines of the loop-closure reports, and the labelled side-by-side videos."""

import numpy as np
import pytest

from jaxwm.evaluation import baselines
from jaxwm.utils.media import labelled, pose_captions


def _loop(f=5, h=16):
  rng = np.random.default_rng(0)
  gt = rng.integers(0, 256, size=(f, h, h, 3), dtype=np.uint8)
  gt[-1] = gt[0]  # the return frame
  return gt


def test_baseline_videos():
  gt = _loop()
  mean = baselines.baseline_video("mean", gt[0], 5)
  assert mean.shape == gt.shape and mean.dtype == np.uint8
  np.testing.assert_array_equal(mean[3, 7, 2], np.round(gt[0].reshape(-1, 3).mean(0)).astype(np.uint8))
  assert (mean == mean[:1, :1, :1]).all()
  np.testing.assert_array_equal(baselines.baseline_video("copy", gt[0], 5), np.repeat(gt[:1], 5, 0))
  with pytest.raises(ValueError, match="baseline must be one of"):
    baselines.baseline_video("zeros", gt[0], 5)


def test_scores_and_remembers():
  gt = _loop()
  perfect = baselines.frame_scores(gt, gt, 4)
  assert perfect["return_psnr"] == baselines.PSNR_CAP and perfect["between_psnr"] == baselines.PSNR_CAP
  b = baselines.baseline_scores(gt, 4)
  assert set(b) == {"mean_psnr", "mean_ssim", "mean_between_psnr", "mean_between_ssim", "mean_return_psnr",
                    "mean_return_ssim", "copy_between_psnr", "copy_between_ssim"}
  assert b["copy_between_psnr"] < 15  # random frames: copying the first is wrong in between
  assert baselines.remembers({**perfect, **b}) is True
  copy = baselines.frame_scores(baselines.baseline_video("copy", gt[0], 5), gt, 4)
  assert baselines.remembers({**copy, **b}) is False  # wins the return frame, not the frames in between
  assert baselines.remembers({"return_psnr": 1.0}) is None


def test_return_colour_separates_a_global_offset_from_the_rest():
  gt = _loop()
  gt = (40 + gt.astype(np.int64) * 150 // 255).astype(np.uint8)  # room for an offset without clipping
  shifted = gt.copy()
  shifted[4] = gt[0].astype(np.int64) + np.array([-12, -10, 5])  # darker red and green, bluer
  c = baselines.return_colour(shifted, gt, 4)
  np.testing.assert_allclose(c["return_offset_rgb"], [-12, -10, 5])
  assert c["return_offset"] == pytest.approx(-17 / 3) and c["return_psnr_offset_free"] == baselines.PSNR_CAP
  assert baselines.frame_scores(shifted, gt, 4)["return_psnr"] < 30  # the plain PSNR sees the offset
  # Detail errors stay: noise of zero mean is not an offset; float64 brute force of its PSNR.
  noisy = gt.copy()
  noise = np.random.default_rng(1).choice([-8, 8], size=gt[0].shape)
  noise -= np.round(noise.reshape(-1, 3).mean(0)).astype(np.int64)
  noisy[4] = gt[0] + noise
  c = baselines.return_colour(noisy, gt, 4)
  d = noise - noise.reshape(-1, 3).mean(0)
  assert c["return_psnr_offset_free"] == pytest.approx(10 * np.log10(255.0 ** 2 / np.mean(d ** 2)))


def test_labelled_video_has_labels_and_captions():
  gt = _loop()
  c2w = np.repeat(np.eye(4)[None], 5, 0)
  c2w[2, :3, :3] = [[0, 0, 1], [0, 1, 0], [-1, 0, 0]]  # 90 degrees about y
  c2w[3, 0, 3] = 0.5
  caps = pose_captions(c2w)
  assert caps[0] == "frame 0  rot 0deg  move 0.00" and "rot 90deg" in caps[2] and "move 0.50" in caps[3]
  out = labelled({"ground truth": gt, "generated": gt}, caps, scale=4)
  assert out.shape[0] == 5 and out.shape[1] > 64 and out.shape[2] == 2 * 64 + 2
  band = out[:, :14]
  assert (band < 128).any()  # the labels are drawn
  assert not np.array_equal(out[0, -14:], out[2, -14:])  # per-frame captions differ


def _return_grain():
  import importlib.util  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "return_grain.py"
  spec = importlib.util.spec_from_file_location("return_grain", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_return_grain_scores_separate_seed_noise_from_shared_error():
  """benchmarks/return_grain.py's columns on closed forms: independent noise per seed (averaging S seeds gains
  10 log10 S dB, the seeds' fine detail is uncorrelated), a shared error (averaging gains nothing, correlation 1),
  and a pure brightness offset (no low- or high-pass error once the offset is removed)."""
  g = _return_grain()
  rng = np.random.default_rng(0)
  yy, xx = np.mgrid[0:64, 0:64]
  gt = np.stack([60 + xx, 80 + yy, 100 + 0.5 * (xx + yy)], -1).astype(np.float64)  # smooth: no high-pass part
  noisy = gt + rng.normal(0, 10, (4,) + gt.shape)
  s = g.scores(noisy, gt, 1.5)
  np.testing.assert_allclose(s["psnr"], 10 * np.log10(255**2 / 100), atol=0.1)
  np.testing.assert_allclose(s["psnr_seed_mean"] - s["psnr"], 10 * np.log10(4), atol=0.15)
  assert abs(s["hf_corr_seeds"]) < 0.05 and abs(s["hf_corr_gt"]) < 0.05
  shared = gt + rng.normal(0, 10, gt.shape)
  s = g.scores(np.stack([shared] * 3), gt, 1.5)
  np.testing.assert_allclose(s["psnr_seed_mean"], s["psnr"], rtol=1e-9)
  np.testing.assert_allclose(s["hf_corr_seeds"], 1.0, rtol=1e-9)
  s = g.scores(np.stack([gt + 20.0] * 2), gt, 1.5)
  np.testing.assert_allclose(s["psnr"], 10 * np.log10(255**2 / 400), rtol=1e-9)
  assert s["err_low"] < 1e-18 and s["err_high"] < 1e-18
