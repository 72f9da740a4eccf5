"""The teacher-forcing layout (docs/design.md §2, ViewRope §3.4 Stage I).

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

import jax.numpy as jnp
import numpy as np

from jaxwm.models.conditioning import Frames
from jaxwm.models.loci import MemoryPlan
from jaxwm.ops.attention import StaticFrameMask


def chunk_ids(num_frames, chunk_size):
  """``[num_frames]`` chunk index of each frame (frame 0 alone in chunk 0)."""
  if chunk_size < 1 or num_frames < 1 + chunk_size or (num_frames - 1) % chunk_size:
    raise ValueError(f"num_frames={num_frames} must be 1 + k * chunk_size (k >= 1) with chunk_size={chunk_size}")
  f = np.arange(num_frames)
  return np.where(f == 0, 0, 1 + (f - 1) // chunk_size)


@dataclasses.dataclass(frozen=True)
class TeacherForcingLayout:
  """Static index arrays of a training layout (numpy); also used for diffusion forcing, where
  only frame 0 is clean and the noisy frames are the history.

  Attributes:
    clean_frames: ``[Sc]`` clip frame index of each clean sequence position.
    noisy_frames: ``[Sn]`` clip frame index of each noisy sequence position.
    frame_pos: ``[Sc + Sn]`` temporal RoPE position of each sequence position.
    chunk: ``[Sc + Sn]`` chunk index; noisy: ``[Sc + Sn]`` bool.
    mask: ``[Sc + Sn, Sc + Sn]`` bool frame-level attention mask.
    local: ``[Sc + Sn, chunk_size]`` int, each position's own-chunk positions (same chunk, same
      half), the frames frame-sparse attention always attends (-1 pads); the rest of ``mask``
      is the history it selects from (clean frames of earlier chunks).
    writer: ``[Sc + Sn]`` bool, the frames that write LOCI's recurrent memory (the history:
      clean frames in teacher forcing, every frame in diffusion forcing).
  """
  clean_frames: np.ndarray
  noisy_frames: np.ndarray
  frame_pos: np.ndarray
  chunk: np.ndarray
  noisy: np.ndarray
  mask: np.ndarray
  local: np.ndarray
  writer: np.ndarray

  @property
  def num_clean(self):
    return len(self.clean_frames)

  def frames(self, batch, cameras=None, mask=None):
    """:class:`jaxwm.models.conditioning.Frames` of the sequence for ``batch`` rows: positions, the
    layout's ``mask`` (also as ``static_mask``; or the given one, e.g. with chunk drop), ``local`` and LOCI's
    memory plan;
    ``cameras``: :class:`Cameras` of the sequence positions (clip frames ``frame_pos``)."""
    n = len(self.frame_pos)
    return Frames(pos=jnp.broadcast_to(jnp.asarray(self.frame_pos, jnp.float32), (batch, n)), cameras=cameras,
                  mask=jnp.asarray(self.mask)[None] if mask is None else mask, local=jnp.asarray(self.local)[None],
                  plan=MemoryPlan.make(self.chunk, self.writer),
                  static_mask=StaticFrameMask(self.mask) if mask is None else None)


def diffusion_forcing_layout(num_frames, chunk_size):
  """Chunk-wise diffusion forcing (LOCI §4): one sequence of the clip's frames, frame 0 clean and
  every later chunk noised independently; chunk-causal attention over the (noisy) history."""
  ids = chunk_ids(num_frames, chunk_size)
  frames = np.arange(num_frames)
  cq, ck = ids[:, None], ids[None, :]
  local = np.full((num_frames, chunk_size), -1, np.int32)
  for row in range(num_frames):
    hits = np.flatnonzero(ids == ids[row])
    local[row, :len(hits)] = hits
  return TeacherForcingLayout(frames[:1], frames[1:], frames.astype(np.float32), ids, frames > 0, ck <= cq, local,
                              np.ones(num_frames, bool))


LAYOUTS = ("teacher_forcing", "diffusion_forcing")


def make_layout(kind, num_frames, chunk_size):
  """A layout by name (:data:`LAYOUTS`)."""
  if kind == "teacher_forcing":
    return teacher_forcing_layout(num_frames, chunk_size)
  if kind == "diffusion_forcing":
    return diffusion_forcing_layout(num_frames, chunk_size)
  raise ValueError(f"recipe.layout must be one of {LAYOUTS}; got {kind!r}")


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
                              local, ~is_noisy)
