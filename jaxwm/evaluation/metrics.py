"""Image metrics (DESIGN §10): PSNR and SSIM (11x11 Gaussian window, sigma 1.5)."""

import numpy as np


def psnr(a, b, data_range=255.0):
  """Peak signal-to-noise ratio over the last three axes ``[..., H, W, C]`` (inf for identical images)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  mse = np.mean((a - b) ** 2, axis=(-3, -2, -1))
  with np.errstate(divide="ignore"):
    return 10.0 * np.log10(data_range**2 / mse)


def _gaussian_window(size=11, sigma=1.5):
  x = np.arange(size, dtype=np.float64) - (size - 1) / 2
  g = np.exp(-x**2 / (2 * sigma**2))
  return g / g.sum()


def _filter(x, g):
  """Separable 'valid' filtering of ``[..., H, W]`` with the 1-D window ``g``."""
  k = len(g)
  h, w = x.shape[-2:]
  rows = sum(g[i] * x[..., i:h - k + 1 + i, :] for i in range(k))
  return sum(g[i] * rows[..., :, i:w - k + 1 + i] for i in range(k))


def ssim(a, b, data_range=255.0, size=11, sigma=1.5, k1=0.01, k2=0.03):
  """Mean SSIM (Wang et al. 2004) over ``[..., H, W, C]``, channels averaged; 'valid' windows."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  a, b = np.moveaxis(a, -1, -3), np.moveaxis(b, -1, -3)
  g = _gaussian_window(size, sigma)
  c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
  mu_a, mu_b = _filter(a, g), _filter(b, g)
  saa = _filter(a * a, g) - mu_a**2
  sbb = _filter(b * b, g) - mu_b**2
  sab = _filter(a * b, g) - mu_a * mu_b
  s = ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / ((mu_a**2 + mu_b**2 + c1) * (saa + sbb + c2))
  return s.mean(axis=(-3, -2, -1))
