"""The dm-pix metrics against closed forms and two independent float64 SSIM implementations
(the former hand-written separable filter, and explicit per-window statistics of Wang et al. 2004)."""

import numpy as np
import pytest

from jaxwm.evaluation.metrics import psnr, ssim


def _ssim_separable(a, b, data_range=255.0, size=11, sigma=1.5, k1=0.01, k2=0.03):
  """Float64 SSIM over ``[..., H, W, C]``: separable 'valid' Gaussian filter, channels averaged."""
  a, b = np.moveaxis(np.asarray(a, np.float64), -1, -3), np.moveaxis(np.asarray(b, np.float64), -1, -3)
  g = np.exp(-(np.arange(size) - (size - 1) / 2) ** 2 / (2 * sigma**2))
  g /= g.sum()

  def f(x):
    h, w = x.shape[-2:]
    rows = sum(g[i] * x[..., i:h - size + 1 + i, :] for i in range(size))
    return sum(g[i] * rows[..., :, i:w - size + 1 + i] for i in range(size))

  c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
  ma, mb = f(a), f(b)
  saa, sbb, sab = f(a * a) - ma**2, f(b * b) - mb**2, f(a * b) - ma * mb
  s = ((2 * ma * mb + c1) * (2 * sab + c2)) / ((ma**2 + mb**2 + c1) * (saa + sbb + c2))
  return s.mean(axis=(-3, -2, -1))


def _ssim_direct(a, b, data_range=255.0):
  """Per channel, every 11x11 window, explicit Gaussian-weighted statistics; ``[H, W, C]``."""
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


def _pair(shape, seed=0):
  rng = np.random.default_rng(seed)
  a = rng.integers(0, 256, shape).astype(np.uint8)
  return a, np.clip(a + rng.normal(0, 20, shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("offset", [1, 10, 37])
def test_psnr_closed_form(offset):
  a = np.zeros((2, 12, 13, 3), np.uint8)
  np.testing.assert_allclose(psnr(a, a + offset), [20 * np.log10(255.0 / offset)] * 2, rtol=1e-6)
  np.testing.assert_allclose(psnr(a[0] / 255, (a[0] + offset) / 255, data_range=1.0),
                             20 * np.log10(255.0 / offset), rtol=1e-6)
  assert psnr(a[0], a[0]) == np.inf and np.isinf(psnr(a, a)).all()  # identical frames: inf, documented


def test_psnr_matches_mse_definition():
  a, b = _pair((3, 16, 18, 3))
  mse = np.mean((a.astype(np.float64) - b) ** 2, axis=(-3, -2, -1))
  np.testing.assert_allclose(psnr(a, b), 10 * np.log10(255.0**2 / mse), rtol=1e-6)
  np.testing.assert_allclose(psnr(a, b[0]), psnr(a, np.broadcast_to(b[0], a.shape)))


def test_ssim_matches_references():
  a, b = _pair((2, 3, 20, 24, 3))
  got = ssim(a, b)
  assert got.shape == (2, 3)
  np.testing.assert_allclose(got, _ssim_separable(a, b), atol=1e-6)
  np.testing.assert_allclose(ssim(a[0, 0], b[0, 0]), _ssim_direct(a[0, 0] * 1.0, b[0, 0] * 1.0), atol=1e-6)
  np.testing.assert_allclose(ssim(a[0] * 1.0, b[0] * 1.0), _ssim_separable(a[0], b[0]), atol=1e-6)  # float in
  np.testing.assert_allclose(ssim(a, a), 1.0, atol=1e-6)
  flat = np.full((16, 16, 3), 100, np.uint8)  # zero-variance windows
  step = flat.copy()
  step[8:] = 120
  np.testing.assert_allclose(ssim(flat, step), _ssim_separable(flat, step), atol=1e-5)
