"""LOCI's panorama memory (LOCI App. A; docs/design.md §8), at frame granularity.

Retained: the sink (frame 0), a bank of at most ``bank_size`` frames and the ``recent`` latest
frames (then the current chunk). Each frame is its camera centre and a field-of-view mask over
``directions`` Fibonacci-sphere directions. ``cov(i, S)`` is the fraction of frame ``i``'s
directions already seen by frames of ``S`` whose centres are within ``radius``. A frame leaving
the recent window (in source order) joins the bank if ``1 - cov(f, {0} | bank) >= min_new``;
when the bank then exceeds ``bank_size``, the member with the largest
``cov(b, {0} | bank - {b})`` is evicted, ties removing the newer.
"""

import numpy as np

from jaxwm.geometry.sphere import fibonacci_sphere, fov_mask
from jaxwm.memory.policy import MemoryPolicy


def coverage(mask, center, others_masks, others_centers, radius):
  """``|M_i & union_{j near i} M_j| / |M_i|`` (1 for an empty mask)."""
  total = mask.sum()
  if total == 0:
    return 1.0
  near = [m for m, c in zip(others_masks, others_centers) if np.linalg.norm(c - center) < radius]
  if not near:
    return 0.0
  seen = np.logical_or.reduce(near)
  return float((mask & seen).sum() / total)


class PanoramaMemory(MemoryPolicy):
  """Args:
    image_hw: the frames' pixel size (for the field-of-view masks).
    bank_size, recent: LOCI's 20 and 8.
    directions, radius, min_new: 4096, 6 (m), 0.3.
  """

  name = "panorama"

  @classmethod
  def build(cls, *, max_frames, chunk_frames, image_hw, **kwargs):
    del max_frames, chunk_frames
    return cls(image_hw, **kwargs)

  def __init__(self, image_hw, bank_size=20, recent=8, directions=4096, radius=6.0, min_new=0.3):
    self.image_hw = tuple(image_hw)
    self.bank_size, self.recent_n, self.radius, self.min_new = bank_size, recent, radius, min_new
    self.capacity = 1 + bank_size + recent
    self.dirs = fibonacci_sphere(directions)
    self.info = {}  # frame -> (center, mask)
    self.sink = None
    self.bank = []
    self.recent = []

  def update(self, frames, c2w, intrinsics):
    c2w, intrinsics = np.asarray(c2w, np.float64), np.asarray(intrinsics, np.float64)
    masks = np.asarray(fov_mask(self.dirs, c2w, intrinsics, self.image_hw))
    for f, pose, m in zip(frames, c2w, masks):
      f = int(f)
      self.info[f] = (pose[:3, 3], m)
      if self.sink is None:
        self.sink = f
        continue
      self.recent.append(f)
      while len(self.recent) > self.recent_n:
        self._consider(self.recent.pop(0))
    live = set(self.resident())
    self.info = {f: v for f, v in self.info.items() if f in live}  # the rest can never come back

  def cov(self, f, others):
    center, mask = self.info[f]
    return coverage(mask, center, [self.info[o][1] for o in others], [self.info[o][0] for o in others], self.radius)

  def _consider(self, f):
    if 1.0 - self.cov(f, [self.sink] + self.bank) < self.min_new:
      return
    self.bank.append(f)
    if len(self.bank) > self.bank_size:
      covs = [self.cov(b, [self.sink] + [o for o in self.bank if o != b]) for b in self.bank]
      top = max(covs)
      self.bank.remove(max(b for b, c in zip(self.bank, covs) if c == top))  # ties: the newer

  def resident(self):
    return ([self.sink] if self.sink is not None else []) + sorted(self.bank) + list(self.recent)


POLICIES = (PanoramaMemory,)
