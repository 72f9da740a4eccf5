"""ReWorld's landmark memory (ReWorld §2.3, Eq. 3; docs/design.md §8), at chunk granularity.

The cache holds the sink chunk, the ``recent`` latest chunks and ``retrieved`` landmarks. A
chunk leaving the recent window enters the bank if the camera has travelled at least
``stride`` median step lengths since the last admitted landmark (an odometer: never "is it
already banked", so a revisit pass is stored like the first visit). Past ``bank_size``
members, the member whose nearest neighbour is closest is evicted (ties: the newer); the first
``protected`` members are never evicted. After every chunk the ``retrieved`` members nearest
the current pose are the working set. A chunk's pose: rotation of its first frame, mean
translation of its frames; distances add ``rotation_weight`` times the rotation angle, so
rotation-only loops are indexed too. The bank's keys/values live in host memory; only the
working set is on device (the sampler moves them).
"""

import numpy as np

from jaxwm.memory.policy import MemoryPolicy, pose_distance


class LandmarkMemory(MemoryPolicy):
  """Args:
    chunk_frames: frames per generated chunk (device slots are counted in frames).
    recent, retrieved, bank_size: ReWorld's 5, 6, 30.
    stride: admission stride, in median step lengths.
    rotation_weight: metres (scene units) per radian in pose distances.
    protected: bank members never evicted (the first admitted).
    retrieve_by: ``"current"`` (ReWorld: nearest the last generated chunk's pose) or ``"next"``
      (nearest the pose of the chunk about to be generated; the rollout calls :meth:`look_ahead`).
  """

  name = "landmark"

  @classmethod
  def build(cls, *, max_frames, chunk_frames, image_hw, **kwargs):
    del max_frames, image_hw
    return cls(chunk_frames, **kwargs)

  def __init__(self, chunk_frames, recent=5, retrieved=6, bank_size=30, stride=4.0, rotation_weight=1.0,
               protected=2, retrieve_by="current"):
    if retrieve_by not in ("current", "next"):
      raise ValueError(f"retrieve_by must be 'current' or 'next'; got {retrieve_by!r}")
    self.retrieve_by = retrieve_by
    self.chunk_frames, self.recent_n, self.retrieved_n = chunk_frames, recent, retrieved
    self.bank_size, self.stride, self.rotation_weight, self.protected = bank_size, stride, rotation_weight, protected
    self.capacity = (1 + recent + retrieved) * chunk_frames
    self.chunks = {}  # chunk id -> frames, t, r, odo (only chunks that may still be attended)
    self._next_id = 0
    self.sink = None
    self.recent = []  # chunk ids
    self.bank = []  # chunk ids, in admission order
    self.retrieved = []
    self.last_landmark = None
    self._steps = []
    self._last_pose = None
    self._odometer = 0.0

  def _median_step(self):
    return float(np.median(self._steps)) if self._steps else 0.0

  def update(self, frames, c2w, intrinsics):
    c2w = np.asarray(c2w, np.float64)
    odo_first = None
    for pose in c2w:
      if self._last_pose is not None:
        step = float(pose_distance(pose[:3, 3], pose[:3, :3], self._last_pose[:3, 3], self._last_pose[:3, :3],
                                   self.rotation_weight))
        self._steps.append(step)
        self._odometer += step
      odo_first = self._odometer if odo_first is None else odo_first
      self._last_pose = pose
    cid = self._next_id
    self._next_id += 1
    self.chunks[cid] = {"frames": [int(f) for f in frames], "t": c2w[:, :3, 3].mean(0), "r": c2w[0, :3, :3],
                        "odo": odo_first}
    if self.sink is None:
      self.sink = cid
    else:
      self.recent.append(cid)
      while len(self.recent) > self.recent_n:
        self._consider(self.recent.pop(0))
    self.retrieved = self._retrieve(cid)
    self._forget()

  def _consider(self, cid):
    """Odometer admission of a chunk leaving the recent window, then eviction."""
    median = self._median_step()
    if self.last_landmark is not None:
      travelled = self.chunks[cid]["odo"] - self.chunks[self.last_landmark]["odo"]
      if travelled < self.stride * median or travelled <= 0.0:
        return
    self.bank.append(cid)
    self.last_landmark = cid
    if len(self.bank) > self.bank_size:
      self.bank.remove(self._most_redundant())

  def _pairwise(self, ids_a, ids_b):
    """Pose distances ``[len(a), len(b)]`` between chunks (one vectorised call)."""
    t = lambda ids: np.stack([self.chunks[c]["t"] for c in ids])
    r = lambda ids: np.stack([self.chunks[c]["r"] for c in ids])
    return pose_distance(t(ids_a)[:, None], r(ids_a)[:, None], t(ids_b)[None], r(ids_b)[None], self.rotation_weight)

  def _most_redundant(self):
    """The evictable member whose nearest neighbour is closest (ties: the newer)."""
    d = self._pairwise(self.bank, self.bank)
    np.fill_diagonal(d, np.inf)
    nearest = d.min(axis=1)[self.protected:]
    ties = np.flatnonzero(nearest == nearest.min())
    return self.bank[self.protected + int(ties[-1])]

  def _retrieve(self, current):
    if not self.bank:
      return []
    d = self._pairwise([current], self.bank)[0]
    order = np.lexsort((np.arange(len(self.bank)), d))  # nearest first, earlier members first on ties
    return [self.bank[i] for i in order[:self.retrieved_n]]

  def look_ahead(self, c2w):
    """With ``retrieve_by="next"``: retrieve the landmarks nearest the pose of the chunk about to be
    generated (``c2w [n, 4, 4]``, known from the given trajectory) instead of the last committed one."""
    if self.retrieve_by != "next" or not self.bank:
      return
    c2w = np.asarray(c2w, np.float64)
    t = np.stack([self.chunks[c]["t"] for c in self.bank])
    r = np.stack([self.chunks[c]["r"] for c in self.bank])
    d = pose_distance(c2w[:, :3, 3].mean(0)[None], c2w[0, :3, :3][None], t, r, self.rotation_weight)
    order = np.lexsort((np.arange(len(self.bank)), d))
    self.retrieved = [self.bank[i] for i in order[:self.retrieved_n]]

  def _forget(self):
    """Drops chunks that can never be attended again (not sink, recent or banked)."""
    live = set(self.bank) | set(self.recent) | {self.sink, self.last_landmark}
    for cid in [c for c in self.chunks if c not in live]:
      del self.chunks[cid]

  def resident(self):
    ids = ([self.sink] if self.sink is not None else []) + sorted(self.retrieved) + self.recent
    return sorted(f for cid in ids for f in self.chunks[cid]["frames"])

  def banked(self):
    return {f for cid in self.bank for f in self.chunks[cid]["frames"]}


POLICIES = (LandmarkMemory,)
