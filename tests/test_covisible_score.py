"""The co-visible score on constructed cases: a fronto-parallel wall seen after a sideways move (the co-visible
fraction's closed form, masks exact under reduction), a camera turned away (no score, not a made-up one), the
depth warp of a rendered rotation (> 40 dB) and the masked PSNR / SSIM against their definitions."""

import numpy as np
import pytest

from jaxwm.evaluation import covisible
from jaxwm.evaluation.metrics import ssim

H = W = 64
F_PX = 32.0
K = np.array([[F_PX, 0, W / 2], [0, F_PX, H / 2], [0, 0, 1]])


def _wall_pair(tx=0.0, yaw_deg=0.0, z=2.0):
  """Two cameras looking at a wall at depth z: frame 1 moved by ``tx`` (m, camera x) and turned by ``yaw_deg``."""
  c2w = np.tile(np.eye(4), (2, 1, 1))
  c2w[1, 0, 3] = tx
  a = np.radians(yaw_deg)
  c2w[1, :3, :3] = [[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]]
  return np.full((2, H, W), z), c2w, np.tile(K, (2, 1, 1))


@pytest.mark.parametrize("tx", [0.25, 0.5, 1.0, 1.5])
def test_sideways_translation_fraction_closed_form(tx):
  # The image shifts by s = f tx / z px: frame 1's pixel u sees frame 0's u + s, inside for u < W - s.
  depth, c2w, k = _wall_pair(tx=tx)
  s = F_PX * tx / 2.0
  cov, rev, full = covisible.covisible_masks(depth, c2w, k, factor=2)
  assert full[1].mean() == pytest.approx(1 - s / W)
  assert cov[1].mean() == pytest.approx(1 - s / W)  # s is even: the reduction is exact
  np.testing.assert_array_equal(cov[1], full[1, ::2, ::2])
  np.testing.assert_array_equal(rev[1], ~full[1, ::2, ::2])
  np.testing.assert_array_equal(cov[1] | rev[1], np.ones_like(cov[1]))
  assert cov[0].all() and not rev[0].any()  # the first frame with itself


def test_odd_shift_leaves_a_boundary_column_out_of_both():
  depth, c2w, k = _wall_pair(tx=3 / 16)  # s = 3 px: one reduced column straddles the boundary
  cov, rev, full = covisible.covisible_masks(depth, c2w, k, factor=2)
  assert full[1].mean() == pytest.approx(1 - 3 / W)
  neither = ~(cov[1] | rev[1])
  assert neither.sum() == H // 2 and neither[:, -2].all()  # render columns 60..63: 60 in, 61.. out
  assert not (cov[1] & rev[1]).any()


def test_turned_away_has_no_score():
  depth, c2w, k = _wall_pair(yaw_deg=180.0)
  cov, rev, _ = covisible.covisible_masks(depth, c2w, k, factor=2)
  assert not cov[1].any() and rev[1].all()
  rng = np.random.default_rng(0)
  gt = rng.integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
  refs = covisible.frame_references(gt[0], gt.astype(float), 2)
  pf = covisible.score_frames(gt, gt, cov, rev, refs, [1])
  assert pf[0]["covis_psnr"] is None and pf[0]["warp_covis_psnr"] is None and pf[0]["covis_ssim"] is None
  assert pf[0]["revealed_psnr"] == 60.0  # the model equals the ground truth on the revealed pixels
  s = covisible.summarize(pf)
  assert s["covis_frames"] == 0 and s["covis_psnr"] is None


def test_revealed_contrast_against_its_closed_forms():
  """The model's variation on the revealed pixels over the ground truth's: 1 for the ground truth itself or any
  image as varied, 0 for a flat fill, k for a contrast scaled by k about any colour; None without pixels."""
  rng = np.random.default_rng(1)
  gt = rng.uniform(0, 255, (2, 16, 16, 3))
  rev = np.zeros((2, 16, 16), bool)
  rev[1, :, 5:] = True
  m = gt[1][rev[1]].mean(0)
  half = gt.copy()
  half[1] = 0.5 * (gt[1] - m) + 100.0
  flat = np.broadcast_to(m, gt.shape)
  shuffled = gt.copy()
  shuffled[1][rev[1]] = rng.permutation(gt[1][rev[1]])
  for video, want in ((gt, 1.0), (half, 0.5), (flat, 0.0), (shuffled, 1.0)):
    pf = covisible.score_frames(video, gt, rev & False, rev, {}, [0, 1])
    assert pf[0]["revealed_contrast"] is None
    assert pf[1]["revealed_contrast"] == pytest.approx(want, abs=1e-12)
  # Against a float64 brute force of the definition on two channels of different spread.
  a, b = rng.normal(0, [1, 5, 2], (40, 3)), rng.normal(0, [3, 1, 1], (40, 3))
  want = np.sqrt(sum(np.mean((a[:, c] - a[:, c].mean()) ** 2) for c in range(3)) /
                 sum(np.mean((b[:, c] - b[:, c].mean()) ** 2) for c in range(3)))
  assert covisible.masked_contrast(a.reshape(5, 8, 3), b.reshape(5, 8, 3), np.ones((5, 8), bool)) == \
      pytest.approx(want, rel=1e-12)
  assert covisible.masked_contrast(a.reshape(5, 8, 3), np.zeros((5, 8, 3)), np.ones((5, 8), bool)) is None


def test_occluder_hides_the_wall():
  depth, c2w, k = _wall_pair()
  depth[1, :, :32] = 1.0  # the left half of frame 1 sees something 1 m away that frame 0 cannot see
  cov, rev, full = covisible.covisible_masks(depth, c2w, k, factor=2)
  assert not full[1, :, :32].any() and full[1, :, 33:].all()


def test_warp_reference_of_a_rotation_loop_is_above_40_db():
  from configs.tiny import get_config  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.clips import eval_clip  # pylint: disable=g-import-not-at-top
  c = get_config()
  w = eval_clip(c, 1)  # yaw, 45 degrees
  factor = c.data.render_size // c.data.image_size
  s, pf = covisible.clip_scores(w["frames"], w["frames"], w["meta"]["source"], w["frame_index"], factor,
                                range(1, w["return_frame"]))
  scored = [r for r in pf if r["covis_psnr"] is not None]
  assert scored, "a rotation loop keeps part of its first view in sight"
  assert all(r["warp_covis_psnr"] > 40 for r in scored)
  assert all(r["covis_psnr"] == 60.0 for r in scored)  # the ground truth itself: capped, exact
  assert s["mean_covis_psnr"] < 30 and s["copy_covis_psnr"] < 30


def test_masked_metrics_against_their_definitions():
  rng = np.random.default_rng(1)
  a = rng.integers(0, 256, (20, 24, 3)).astype(np.uint8)
  b = rng.integers(0, 256, (20, 24, 3)).astype(np.uint8)
  mask = rng.random((20, 24)) < 0.4
  d = [(float(a[i, j, c]) - float(b[i, j, c])) ** 2 for i in range(20) for j in range(24) for c in range(3)
       if mask[i, j]]
  assert covisible.masked_psnr(a, b, mask) == pytest.approx(10 * np.log10(255**2 / np.mean(d)))
  assert covisible.masked_psnr(a, b, np.zeros_like(mask)) is None
  full = np.ones((20, 24), bool)
  assert covisible.masked_ssim(a, b, full) == pytest.approx(float(ssim(a, b)), abs=1e-5)
  m = covisible.ssim_map(a, b)
  centres = mask[5:15, 5:19]
  assert covisible.masked_ssim(a, b, mask) == pytest.approx(m[centres].mean())
  edge = np.zeros((20, 24), bool)
  edge[:5] = True  # no 11x11 window is centred there
  assert covisible.masked_ssim(a, b, edge) is None


def test_slanted_plane_counts_as_one_surface():
  # A plane tilted by 40 degrees about the camera's x axis: depth changes fast down the image (a floor seen at a
  # grazing angle). Moving the camera by tx along x keeps the depth map and shifts row v by s(v) = f tx / z(v), so
  # row v has W - ceil(s(v)) co-visible pixel centres.
  a, tx = np.radians(40.0), 0.3
  v = np.arange(H) + 0.5

  dy = (v - H / 2) / F_PX
  n = np.array([0.0, -np.sin(a), np.cos(a)])
  z = 2.0 * np.cos(a) / (n[1] * dy + n[2])  # plane n . X = 2 cos(a), X = z (x, y, 1)
  assert (z > 0).all() and z.max() / z.min() > 3  # steep: far more than the 2% depth agreement of one pixel
  depth = np.broadcast_to(z[:, None], (H, W))
  depth = np.stack([depth, depth])
  _, c2w, k = _wall_pair(tx=tx)
  _, _, full = covisible.covisible_masks(depth, c2w, k)
  s = F_PX * tx / z
  want = (W - np.ceil(s)) / W
  got = full[1].mean(axis=1)
  # Rows whose depth changes by under 10% a pixel are one surface (a pixel of slack at each row's edge); at the most
  # grazing rows the test may drop pixels as a depth edge, never add any.
  step = np.abs(np.gradient(z)) / z
  assert (step < 0.1).mean() > 0.9
  np.testing.assert_allclose(got[step < 0.1], want[step < 0.1], atol=1.5 / W)
  assert (got <= want + 1.5 / W).all()

