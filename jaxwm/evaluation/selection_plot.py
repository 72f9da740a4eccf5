"""Frame-selection maps in the manner of ViewRope Fig. 3: query frames down, key frames across.

Cells show the block relevance (Eq. 9, grey scale) when given; selected history frames are
red, the own chunk (always attended) is blue, frames outside the history are dark.
"""

import numpy as np
from PIL import Image


def selection_image(selected, num_key_frames, *, scores=None, local=None, history=None, cell=8):
  """Renders one selection map.

  Args:
    selected: ``[Fq, k]`` int selected key frames per query frame (-1 pads).
    num_key_frames: ``Fk``.
    scores: optional ``[Fq, Fk]`` relevance, shown normalised per row.
    local: optional ``[Fq, C]`` int own-chunk frames (-1 pads).
    history: optional ``[Fq, Fk]`` bool candidates; others are drawn dark.
    cell: pixels per cell.

  Returns:
    ``[Fq*cell, Fk*cell, 3]`` uint8.
  """
  selected = np.asarray(selected)
  fq = selected.shape[0]
  img = np.full((fq, num_key_frames, 3), 235, np.float32)
  if scores is not None:
    s = np.asarray(scores, np.float32)
    lo, hi = s.min(axis=1, keepdims=True), s.max(axis=1, keepdims=True)
    g = 255.0 * (1.0 - (s - lo) / np.maximum(hi - lo, 1e-12))
    img[:] = g[..., None]
  if history is not None:
    img[~np.asarray(history)] = 40.0
  for rows, colour in ((local, (60, 110, 230)), (selected, (230, 50, 40))):
    if rows is None:
      continue
    for i, row in enumerate(np.asarray(rows)):
      for j in row[row >= 0]:
        img[i, j] = colour
  return np.repeat(np.repeat(img.astype(np.uint8), cell, axis=0), cell, axis=1)


def save_selection_maps(path, selected, num_key_frames, **kwargs):
  """Saves one map per layer side by side: ``selected [L, Fq, k]`` (e.g. a model's
  ``entries["selected"][:, b]``) -> PNG at ``path``."""
  maps = [selection_image(s, num_key_frames, **kwargs) for s in np.asarray(selected)]
  gap = np.full((maps[0].shape[0], 4, 3), 255, np.uint8)
  row = np.concatenate(sum(([m, gap] for m in maps), [])[:-1], axis=1)
  Image.fromarray(row).save(path)
  return path
