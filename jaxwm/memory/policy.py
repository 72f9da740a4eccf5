"""The memory-policy interface the streaming sampler uses, and the two simple policies.

A policy sees every committed frame (its index and camera) and says which earlier frames the
next chunk attends to. The sampler keeps those frames in a fixed number of device slots
(``capacity``) and gives them compact temporal positions ``0 .. h-1`` in source order, the new
chunk continuing at ``h`` (docs/design.md §8), so the per-chunk step compiles once whatever the
rollout length. Frames a policy may bring back later (``banked``) are copied to host memory
before their slot is reused.
"""

import numpy as np


class MemoryPolicy:
  """Base class. Subclasses set ``name`` (the registry key, :mod:`jaxwm.memory`) and ``capacity`` and implement
  :meth:`update` and :meth:`resident`; :meth:`build` (from the rollout's sizes) and :meth:`look_ahead` have
  defaults."""

  name = "base"
  capacity: int

  @classmethod
  def build(cls, *, max_frames, chunk_frames, image_hw, **kwargs):
    """The policy for a rollout of ``max_frames`` frames in chunks of ``chunk_frames``, frames ``image_hw``
    pixels; ``kwargs`` are the policy's own settings. Default: ``cls(**kwargs)``."""
    del max_frames, chunk_frames, image_hw
    return cls(**kwargs)

  def update(self, frames, c2w, intrinsics):
    """Records newly committed ``frames`` (ints, increasing) with ``c2w [n, 4, 4]`` and ``intrinsics [n, 3, 3]``."""
    raise NotImplementedError

  def resident(self):
    """Frames the next chunk attends to, in source order (at most ``capacity``)."""
    raise NotImplementedError

  def banked(self):
    """Frames whose keys/values must survive leaving the device (host master copy)."""
    return set()

  def look_ahead(self, c2w):
    """The poses ``c2w [n, 4, 4]`` of the chunk about to be generated, when the rollout knows them (before
    :meth:`resident` is asked for it). Default: ignored."""
    del c2w


class FullMemory(MemoryPolicy):
  """Every frame, up to ``capacity`` frames (the rollout length)."""

  name = "full"

  @classmethod
  def build(cls, *, max_frames, chunk_frames, image_hw, **kwargs):
    del chunk_frames, image_hw
    return cls(max_frames, **kwargs)

  def __init__(self, capacity):
    self.capacity = capacity
    self._frames = []

  def update(self, frames, c2w, intrinsics):
    self._frames += [int(f) for f in frames]
    if len(self._frames) > self.capacity:
      raise ValueError(f"the full memory holds {self.capacity} frames; {len(self._frames)} were committed "
                       "(raise max_frames or use a bounded policy)")

  def resident(self):
    return list(self._frames)


class WindowMemory(MemoryPolicy):
  """Sink plus sliding window: the first ``sink`` frames and the latest ``window`` frames."""

  name = "window"

  def __init__(self, sink=1, window=8):
    self.sink, self.window = sink, window
    self.capacity = sink + window
    self._frames = []

  def update(self, frames, c2w, intrinsics):
    self._frames += [int(f) for f in frames]
    self._frames = self.resident()  # bounded: an unbounded session keeps sink + window frame ids, no more

  def resident(self):
    head = self._frames[:self.sink]
    tail = self._frames[self.sink:][-self.window:] if self.window else []
    return head + tail


POLICIES = (FullMemory, WindowMemory)


def pose_distance(t_a, r_a, t_b, r_b, rotation_weight):
  """``|t_a - t_b| + rotation_weight * angle(R_a^T R_b)`` (broadcasting over leading axes)."""
  from jaxwm.geometry.rotations import geodesic_angle  # pylint: disable=g-import-not-at-top
  return np.linalg.norm(np.asarray(t_a) - np.asarray(t_b), axis=-1) + rotation_weight * np.asarray(
      geodesic_angle(np.asarray(r_a, np.float64), np.asarray(r_b, np.float64)))
