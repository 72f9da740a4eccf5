"""Procedural textures: multi-scale value noise, soft stripes and colour patches.

Textures are band-limited (smooth at the texel scale) so that a view is recognisable and
bilinear resampling of a rendered frame (the projective-warp tests) stays close to a
re-render.
"""

import numpy as np


def _upsample(grid, size):
  """Bilinear upsampling of ``[g, g, C]`` to ``[size, size, C]`` (align-corners)."""
  g = grid.shape[0]
  x = np.linspace(0.0, g - 1.0, size, dtype=np.float32)
  x0 = np.minimum(np.floor(x).astype(np.int32), g - 2)
  f = (x - x0)[:, None]
  rows = grid[x0] * (1 - f[..., None]) + grid[x0 + 1] * f[..., None]
  return rows[:, x0] * (1 - f[None]) + rows[:, x0 + 1] * f[None]


def value_noise(rng, size, octaves=(4, 8, 16, 32, 64), channels=1, persistence=0.6):
  """Multi-scale value noise in ``[0, 1]``: ``[size, size, channels]``."""
  out = np.zeros((size, size, channels), np.float32)
  amp, total = 1.0, 0.0
  for o in octaves:
    out += amp * _upsample(rng.random((o + 1, o + 1, channels), dtype=np.float32), size)
    total += amp
    amp *= persistence
  out /= total
  lo, hi = out.min(), out.max()
  return (out - lo) / max(hi - lo, 1e-6)


def _smoothstep(x):
  x = np.clip(x, 0.0, 1.0)
  return x * x * (3 - 2 * x)


def _box_blur(tex, passes=1):
  for _ in range(passes):
    p = np.pad(tex, ((1, 1), (1, 1), (0, 0)), mode="edge")
    tex = (p[:-2] + p[1:-1] + p[2:]) / 3.0
    tex = (tex[:, :-2] + tex[:, 1:-1] + tex[:, 2:]) / 3.0
  return tex


def random_palette(rng, n):
  """``[n, 3]`` saturated random colours (HSV with random hue)."""
  h = rng.random(n)
  s = rng.uniform(0.35, 0.9, n)
  v = rng.uniform(0.45, 0.95, n)
  i = np.floor(h * 6).astype(int) % 6
  f = h * 6 - np.floor(h * 6)
  p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
  table = np.stack([np.stack(c, -1) for c in [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]], 1)
  return table[np.arange(n), i].astype(np.float32)


def make_texture(rng, size=256):
  """One surface texture ``[size, size, 3]`` float32 in ``[0.04, 0.96]``.

  Base: two palette colours mixed by soft stripes (random direction and frequency) and
  modulated by multi-scale noise; then 3-9 soft-edged discs and rectangles of other colours.
  """
  pal = random_palette(rng, 2 + 9)
  yy, xx = np.meshgrid(np.linspace(0, 1, size, dtype=np.float32), np.linspace(0, 1, size, dtype=np.float32),
                       indexing="ij")
  theta = rng.uniform(0, np.pi)
  freq = rng.uniform(2.0, 9.0)
  phase = rng.uniform(0, 2 * np.pi)
  s = np.sin(2 * np.pi * freq * (xx * np.cos(theta) + yy * np.sin(theta)) + phase)
  mix = _smoothstep(0.5 + s * rng.uniform(0.7, 1.5))[..., None]
  tex = pal[0] * (1 - mix) + pal[1] * mix
  tex = tex * (0.55 + 0.45 * value_noise(rng, size, channels=1)) + 0.25 * (value_noise(rng, size, channels=3) - 0.5)
  soft = 2.5 / size
  for j in range(int(rng.integers(3, 10))):
    cx, cy = rng.random(2)
    r = rng.uniform(0.04, 0.16)
    if rng.random() < 0.5:
      dist = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2) - r
    else:
      dist = np.maximum(np.abs(xx - cx) - r, np.abs(yy - cy) - r * rng.uniform(0.4, 1.6))
    a = _smoothstep(0.5 - dist / (2 * soft))[..., None] * rng.uniform(0.6, 1.0)
    tex = tex * (1 - a) + pal[2 + j] * a
  return np.clip(_box_blur(tex.astype(np.float32)), 0.04, 0.96)
