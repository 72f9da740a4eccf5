"""The teacher-forcing layout (DESIGN §2, ViewRope §3.4 Stage I).

Frames of a clip are grouped in chunks: chunk 0 is the conditioning first frame, then chunks
of ``chunk_size`` frames (``num_frames = 1 + k * chunk_size``). The model sees one sequence
``[clean frames of chunks 0..C-2 ; noisy frames of chunks 1..C-1]`` (the last clean chunk
and the noisy conditioning frame would influence nothing in the loss, so they are left out).

- Clean frames of chunk ``c`` attend to the clean frames of chunks ``<= c`` (the keys a
  streaming commit of chunk ``c`` puts in the cache).
- Noisy frames of chunk ``c`` attend to the clean frames of chunks ``< c`` and to the noisy
  frames of chunk ``c``.
Both halves use the frames' own indices as temporal RoPE positions.
"""

import dataclasses

import numpy as np


def chunk_ids(num_frames, chunk_size):
  """``[num_frames]`` chunk index of each frame (frame 0 alone in chunk 0)."""
  if chunk_size < 1 or num_frames < 1 + chunk_size or (num_frames - 1) % chunk_size:
    raise ValueError(f"num_frames={num_frames} must be 1 + k * chunk_size (k >= 1) with chunk_size={chunk_size}")
  f = np.arange(num_frames)
  return np.where(f == 0, 0, 1 + (f - 1) // chunk_size)


@dataclasses.dataclass(frozen=True)
class TeacherForcingLayout:
  """Static index arrays of the layout (numpy).

  Attributes:
    clean_frames: ``[Sc]`` clip frame index of each clean sequence position.
    noisy_frames: ``[Sn]`` clip frame index of each noisy sequence position.
    frame_pos: ``[Sc + Sn]`` temporal RoPE position of each sequence position.
    chunk: ``[Sc + Sn]`` chunk index; noisy: ``[Sc + Sn]`` bool.
    mask: ``[Sc + Sn, Sc + Sn]`` bool frame-level attention mask.
    local: ``[Sc + Sn, chunk_size]`` int, each position's own-chunk positions (same chunk, same
      half), the frames frame-sparse attention always attends (-1 pads); the rest of ``mask``
      is the history it selects from (clean frames of earlier chunks).
  """
  clean_frames: np.ndarray
  noisy_frames: np.ndarray
  frame_pos: np.ndarray
  chunk: np.ndarray
  noisy: np.ndarray
  mask: np.ndarray
  local: np.ndarray

  @property
  def num_clean(self):
    return len(self.clean_frames)


def teacher_forcing_layout(num_frames, chunk_size):
  """Builds the :class:`TeacherForcingLayout` of a clip."""
  ids = chunk_ids(num_frames, chunk_size)
  last = ids.max()
  clean = np.flatnonzero(ids < last)
  noisy = np.flatnonzero(ids > 0)
  chunk = np.concatenate([ids[clean], ids[noisy]])
  is_noisy = np.concatenate([np.zeros(len(clean), bool), np.ones(len(noisy), bool)])
  cq, ck = chunk[:, None], chunk[None, :]
  nq, nk = is_noisy[:, None], is_noisy[None, :]
  mask = (~nk & ((~nq & (ck <= cq)) | (nq & (ck < cq)))) | (nk & nq & (ck == cq))
  same = (ck == cq) & (nk == nq)
  local = np.full((len(chunk), chunk_size), -1, np.int32)
  for row, cols in enumerate(same):
    hits = np.flatnonzero(cols)
    local[row, :len(hits)] = hits
  return TeacherForcingLayout(clean, noisy, np.concatenate([clean, noisy]).astype(np.float32), chunk, is_noisy, mask,
                              local)
