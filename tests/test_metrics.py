"""PSNR in closed form; SSIM against a direct float64 implementation of Wang et al. (2004)."""

import numpy as np

from jaxwm.evaluation.metrics import psnr, ssim


def test_psnr_closed_form():
  a = np.zeros((4, 5, 3))
  b = a + 10.0
  np.testing.assert_allclose(psnr(a, b), 10 * np.log10(255.0**2 / 100.0))
  assert psnr(a, a) == np.inf


def _ssim_direct(a, b, data_range=255.0):
  """Per channel, every 11x11 window, explicit Gaussian-weighted statistics."""
  r = np.arange(11) - 5
  w = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * 1.5**2))
  w /= w.sum()
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  vals = []
  for ch in range(a.shape[-1]):
    x, y = a[..., ch], b[..., ch]
    for i in range(a.shape[0] - 10):
      for j in range(a.shape[1] - 10):
        px, py = x[i:i + 11, j:j + 11], y[i:i + 11, j:j + 11]
        mx, my = (w * px).sum(), (w * py).sum()
        vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
        cxy = (w * (px - mx) * (py - my)).sum()
        vals.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
  return np.mean(vals)


def test_ssim_matches_direct_formula():
  rng = np.random.default_rng(0)
  a = rng.integers(0, 256, (16, 18, 3)).astype(np.float64)
  b = np.clip(a + rng.normal(0, 20, a.shape), 0, 255)
  np.testing.assert_allclose(ssim(a, b), _ssim_direct(a, b), rtol=1e-10)
  np.testing.assert_allclose(ssim(a, a), 1.0)
  batch = ssim(np.stack([a, a]), np.stack([b, a]))
  np.testing.assert_allclose(batch, [_ssim_direct(a, b), 1.0], rtol=1e-10)
