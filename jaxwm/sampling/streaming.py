"""Streaming generation (docs/design.md §2): per chunk, ``S`` Euler steps of the current chunk against a
KV cache that is read, never written, while denoising; then one commit forward of the
finished chunk (clean, ``t = 0``) that writes its keys and values.

Caches are fixed-size buffers plus a validity mask and a length (:class:`jaxwm.models.cache.KVCache`),
so every per-chunk function compiles once, whatever the rollout length. Classifier-free guidance
runs the conditional and unconditional branches as one doubled batch, each with its own cache rows.

Cameras are the model's as they are given (re-anchored on the trajectory's first frame); nothing is
normalised over the trajectory, so a chunk is encoded the same whether the trajectory is known in
advance (:meth:`StreamingSampler.rollout`) or given chunk by chunk (:meth:`StreamingSampler.generate`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.diffusion import flow
from jaxwm.encodings.base import model_poses
from jaxwm.geometry.validate import validate_cameras
from jaxwm.models.cache import KVCache
from jaxwm.models.conditioning import Cameras, Frames
from jaxwm.models.loci import MemoryPlan
from jaxwm.models.transformer import WanModel


def chunk_frames(cache, pos, cameras=None):
  """:class:`Frames` of a chunk at positions ``pos [B, Sc]`` with ``cameras`` (:class:`Cameras` or None)
  reading ``cache``: every valid slot and the chunk itself; the chunk is its own chunk (``local``)
  and, for LOCI, one writing chunk."""
  b, sc = pos.shape
  cap = cache.max_frames
  mask = jnp.concatenate([jnp.broadcast_to(cache.valid[:, None, :], (b, sc, cap)), jnp.ones((b, sc, sc), bool)], -1)
  local = jnp.broadcast_to(cap + jnp.arange(sc, dtype=jnp.int32), (b, sc, sc))
  return Frames(pos=pos, cameras=cameras, mask=mask, local=local,
                plan=MemoryPlan.make(np.ones(sc, int), np.ones(sc, bool)))


def chunk_forward(model, variables, cache, x, t, frame_pos, context=None, cameras=None, rng=None):
  """Velocity of chunk ``x [B, Sc, h, w, C]`` at time ``t`` (``[B, Sc]`` in ``[0, 1]``) against ``cache``.

  ``cameras``: the chunk's own :class:`Cameras` ``[B, Sc]``: queries get their camera's transform,
  cached keys keep theirs. With frame-sparse attention the chunk attends to itself and selects
  among the cache's valid frames (at every call); ``rng`` feeds the ``frame_select`` stream.

  Returns ``(velocity, entries)``: the chunk's own :class:`jaxwm.models.cache.Entries`.
  """
  rngs = None if rng is None else {"frame_select": rng}
  return model.apply(variables, x, t * flow.TIMESTEP_SCALE, chunk_frames(cache, frame_pos, cameras), context=context,
                     cache=cache, rngs=rngs)


def cache_views(model, cache, cameras):
  """What the model's encoding computes once per chunk from the cache's keys and the chunk's ``cameras``
  (:meth:`jaxwm.encodings.base.CameraEncoding.cache_views`: WorldRoPE's per-view keys), shared by the chunk's
  Euler steps and its commit pass (neither the cache nor the cameras change in between): ``{name: [L_softmax,
  B, ...]}``, or ``{}``."""
  cfg = model.cfg
  if cameras is None or not cfg.num_softmax_layers:
    return {}
  return cfg.encoding.cache_views(cfg, cache.keys, model_poses(cameras.c2w, cfg.camera.translation_scale),
                                  cameras.intrinsics)


def with_views(cache, views):
  """``cache`` as the model reads it, with :func:`cache_views`' tensors beside its keys (never written back)."""
  return cache.replace(keys={**cache.keys, **views}) if views else cache


def commit(model, variables, cache, x, frame_pos, context=None, cameras=None, rng=None, slots=None, views=None):
  """Writes the raw keys/values of clean chunk ``x`` (forward at ``t = 0``) into cache slots.

  ``slots``: ``[Sc]`` int slot of each frame (default: the next ones, ``length .. length+Sc-1``);
  the slots' positions are ``frame_pos`` and their cameras the chunk's. LOCI's state is replaced.
  ``views``: :func:`cache_views` of this cache for ``cameras``, when the denoising computed them (else the forward
  computes what it needs itself).
  """
  b, sc = x.shape[:2]
  _, own = chunk_forward(model, variables, with_views(cache, views), x, jnp.zeros((b, sc)), frame_pos, context,
                         cameras, rng)
  slots = cache.length + jnp.arange(sc) if slots is None else jnp.asarray(slots, jnp.int32)
  return cache.write(own, slots, frame_pos, cameras)


def denoise(model, variables, cache, noise, frame_pos, schedule, context=None, guidance=1.0, cameras=None, rng=None,
            views=None):
  """Euler integration of a chunk from ``schedule[0] = 1`` to ``schedule[-1] = 0``; the cache is only read.

  ``rng``: the ``frame_select`` stream, folded with the step index (frame-sparse models). ``views``:
  :func:`cache_views` of ``cache`` for ``cameras`` (computed here when None), shared by every step.

  With ``guidance != 1`` the batch holds ``[conditional; unconditional]`` halves (contexts and
  cache rows alike) and ``v = v_u + guidance (v_c - v_u)`` is applied to both halves.
  """
  b, sc = noise.shape[:2]
  cache = with_views(cache, cache_views(model, cache, cameras) if views is None else views)

  def body(x, ts):
    t, t_next, i = ts
    step_rng = None if rng is None else jax.random.fold_in(rng, i)
    v, _ = chunk_forward(model, variables, cache, x, jnp.full((b, sc), t), frame_pos, context, cameras, step_rng)
    if guidance != 1.0:
      v_c, v_u = jnp.split(v, 2)
      g = v_u + guidance * (v_c - v_u)
      v = jnp.concatenate([g, g])
    return flow.euler_step(x, v, t, t_next), None

  x, _ = jax.lax.scan(body, noise, (schedule[:-1], schedule[1:], jnp.arange(schedule.shape[0] - 1)))
  return x


# Compiled once per (model, shapes), shared by every sampler of the same model.
_commit_jit = jax.jit(commit, static_argnums=(0,), donate_argnums=(2,))
_denoise_jit = jax.jit(denoise, static_argnames=("model", "guidance"))
_views_jit = jax.jit(cache_views, static_argnums=(0,))
_fold_in_jit = jax.jit(jax.random.fold_in)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _chunk_inputs_jit(key, start, shape, rows, scale):
  """A chunk's noise ``scale * normal(key) [rows, n, h, w, C]`` (``shape``: one guidance half's; the halves share
  it) and positions ``start + [0, n)`` ``[rows, n]``: one program (eagerly, their small ops each cost a dispatch)."""
  z = jax.random.normal(key, shape) * scale
  z = jnp.concatenate([z] * (rows // shape[0]))
  pos = jnp.asarray(start, jnp.float32) + jnp.arange(shape[1], dtype=jnp.float32)
  return z, jnp.broadcast_to(pos, (rows, shape[1]))


class StreamingSampler:
  """Chunk-by-chunk generation with a fixed-size KV cache (full memory).

  Args:
    model: a :class:`WanModel`; variables: ``{"params": ...}``.
    batch_size: rollouts generated together.
    max_frames: cache capacity in latent frames (the rollout length).
    latent_hw, channels: latent frame shape.
    num_steps, shift: Euler steps per chunk and schedule shift.
    guidance: classifier-free guidance scale (needs ``model.cross_attn`` and contexts).
    context, null_context: ``[B, Lt, text_dim]`` conditional / unconditional sequences.
    noise_scale: each chunk starts from ``noise_scale * z``, ``z ~ N(0, I)`` (1: the model's prior; a distilled
      student records the scale it was trained with, ``distill.noise_scale``).
  """

  def __init__(self, model: WanModel, variables, *, batch_size, max_frames, latent_hw, channels, num_steps=20,
               shift=1.0, guidance=1.0, context=None, null_context=None, noise_scale=1.0):
    cfg = model.cfg
    if not noise_scale > 0:
      raise ValueError(f"noise_scale={noise_scale}: must be > 0")
    self.noise_scale = float(noise_scale)
    if guidance != 1.0:
      if not cfg.cross_attn or context is None:
        raise ValueError("classifier-free guidance (guidance != 1) needs model.cross_attn and a context")
      null_context = jnp.zeros_like(context) if null_context is None else null_context
      context = jnp.concatenate([context, null_context])
    elif cfg.cross_attn and context is None:
      raise ValueError("model.cross_attn is on: pass context [B, Lt, text_dim]")
    self.model, self.variables, self.cfg = model, variables, cfg
    self.batch_size, self.max_frames = batch_size, max_frames
    self.latent_hw, self.channels = tuple(latent_hw), channels
    self.guidance, self.context = guidance, context
    self.schedule = flow.sampling_schedule(num_steps, shift)
    ph, pw = cfg.patch_size[1:]
    self.tokens_per_frame = (latent_hw[0] // ph) * (latent_hw[1] // pw)

  @property
  def rows(self):
    return self.batch_size * (2 if self.guidance != 1.0 else 1)

  def _rows(self, x):
    return jnp.concatenate([x, x]) if self.guidance != 1.0 else x

  def empty_cache(self):
    return KVCache.empty(self.cfg, self.rows, self.max_frames, self.tokens_per_frame, self.cfg.compute_dtype)

  def _cams(self, cameras):
    """:class:`Cameras` of the rows (conditional and unconditional halves share them)."""
    cameras = Cameras.of(cameras)
    if cameras is None:
      if self.cfg.camera_conditioned:
        raise ValueError(f"this model is camera-conditioned (model.camera.encoding={self.cfg.camera.encoding!r}, "
                         f"plucker={self.cfg.camera.plucker}, loci={self.cfg.loci.enabled}): pass cameras")
      return None
    return cameras.rows(self.rows // self.batch_size)

  def start(self, first, cameras=None, cache=None):
    """Commits the conditioning frame(s) ``first [B, S0, h, w, C]`` at positions ``0..S0-1``."""
    pos = jnp.broadcast_to(jnp.arange(first.shape[1], dtype=jnp.float32), (self.rows, first.shape[1]))
    cache = self.empty_cache() if cache is None else cache
    # Random / exclude-selected frame selection needs a key even here (the conditioning frames have no history).
    rng = jax.random.key(0) if self.cfg.attention.sparse else None
    return _commit_jit(self.model, self.variables, cache, self._rows(first), pos, self.context, self._cams(cameras),
                       rng)

  def generate(self, cache, key, num_frames, cameras=None, start=None, slots=None, commit_before=None):
    """Generates the next ``num_frames`` frames after the cache's frames; returns ``(latents, cache)``.

    ``cameras``: the new frames' :class:`Cameras` (or a mapping with ``c2w``, ``intrinsics``)
    ``[B, num_frames, ...]``, re-anchored on the trajectory's first frame.
    ``start``: temporal position of the first new frame (default: frames committed so far);
    ``slots``: cache slots the commit writes (default: the next ones); ``commit_before(x)``
    runs between denoising and the commit (memory bookkeeping) and may return new ``slots``.
    """
    x, pos, cams, views = self.denoise_chunk(cache, key, num_frames, cameras, start)
    if commit_before is not None:
      slots = commit_before(x)
    return x[:self.batch_size], self.commit_chunk(cache, key, x, pos, cams, slots, views)

  def denoise_chunk(self, cache, key, num_frames, cameras=None, start=None):
    """The first half of :meth:`generate`: ``(x [rows, n, h, w, C], positions, row cameras, views)``, cache
    unchanged; ``views`` (:func:`cache_views`) serve the commit of ``x`` into the same cache."""
    shape = (self.batch_size, num_frames, *self.latent_hw, self.channels)
    z, pos = _chunk_inputs_jit(key, cache.length if start is None else np.float32(start), shape, self.rows,
                               np.float32(self.noise_scale))
    cams = self._cams(cameras)
    views = _views_jit(self.model, cache, cams)
    x = _denoise_jit(model=self.model, variables=self.variables, cache=cache, noise=z, frame_pos=pos,
                     schedule=self.schedule, context=self.context, guidance=self.guidance, cameras=cams,
                     rng=jax.random.fold_in(key, 1) if self.cfg.attention.sparse else None, views=views)
    return x, pos, cams, views

  def commit_chunk(self, cache, key, x, pos, cams, slots=None, views=None):
    """The second half of :meth:`generate`: the denoised chunk written into ``slots``; returns the cache.
    ``views``: :meth:`denoise_chunk`'s, for the same cache (a memory policy's bookkeeping in between only reads it)."""
    return _commit_jit(self.model, self.variables, cache, x, pos, self.context, cams,
                       jax.random.fold_in(key, 2) if self.cfg.attention.sparse else None, slots, views)

  def session(self, first, key, cameras=None, memory=None, slots=None, keep_frames=True):
    """An interactive :class:`Session` from ``first [B, 1, h, w, C]`` (with its ``cameras``): the user gives
    each chunk's cameras as they move, not knowing the rest; it yields what :meth:`rollout` yields on the same
    poses, under any ``memory`` policy (default: the full cache) and for as long as the policy is bounded."""
    return Session(self, first, key, cameras, memory=memory, slots=slots, keep_frames=keep_frames)

  def rollout(self, first, num_frames, chunk_size, key, cameras=None, memory=None, progress=False, callback=None,
              slots=None):
    """``first [B, 1, h, w, C]`` -> ``[B, num_frames, h, w, C]`` (frame 0 is ``first``), chunk by chunk.

    ``num_frames = 1 + k * chunk_size``; chunk ``c`` (from 0) uses noise key ``fold_in(key, c + 1)``.
    ``cameras``: the whole trajectory, ``c2w [B, F, 4, 4]`` (re-anchored on frame 0) and
    ``intrinsics [B, F, 3, 3]``; chunk ``c`` gets exactly the cameras :meth:`generate` would.
    ``memory``: a :class:`jaxwm.memory.MemoryPolicy` (default: the full cache, ``max_frames``
    slots); its policy decides which frames stay, in ``memory.capacity`` device slots, at compact
    positions. Its decisions use the first batch row's cameras. ``progress``: a tqdm bar;
    ``callback(chunk_index, latents)`` runs after every chunk. ``slots``: device frame slots
    (default ``memory.capacity``; a larger fixed buffer lets policies of different capacities
    share one compiled step). Returns host (numpy) latents.
    """
    from jaxwm.memory import FullMemory  # pylint: disable=g-import-not-at-top
    if (num_frames - 1) % chunk_size:
      raise ValueError(f"num_frames={num_frames} must be 1 + k * chunk_size (chunk_size={chunk_size})")
    if memory is None:
      if num_frames > self.max_frames:
        raise ValueError(f"num_frames={num_frames} exceeds the cache capacity max_frames={self.max_frames}")
      memory = FullMemory(self.max_frames)

    def frames(lo, hi):
      return None if cameras is None else cameras.frames(slice(lo, hi))

    host_cams = None
    cameras = Cameras.of(cameras)
    if cameras is not None:
      validate_cameras(cameras.c2w, cameras.intrinsics)
      host_cams = {"c2w": np.asarray(cameras.c2w, np.float64)[0], "intrinsics": np.asarray(cameras.intrinsics,
                                                                                           np.float64)[0]}
    slots = memory.capacity if slots is None else slots
    if slots < memory.capacity:
      raise ValueError(f"slots={slots} is below the memory policy's capacity {memory.capacity}")
    book = _SlotBook(memory, self, host_cams, slots, chunk_size)
    cache = self.start(first, frames(0, 1), cache=KVCache.empty(self.cfg, self.rows, slots, self.tokens_per_frame,
                                                                self.cfg.compute_dtype))
    cache = book.after_commit(cache, [0])
    out = [np.asarray(first)]
    chunks = range((num_frames - 1) // chunk_size)
    if progress:
      from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
      chunks = tqdm(chunks, desc=f"rollout ({memory.name} memory)", unit="chunk")
    for c in chunks:
      lo = 1 + c * chunk_size
      new = list(range(lo, lo + chunk_size))
      x, cache = self.generate(cache, jax.random.fold_in(key, c + 1), chunk_size, frames(lo, lo + chunk_size),
                               start=book.num_resident,
                               commit_before=lambda _, cache=cache, new=new: book.before_commit(cache, new))
      cache = book.after_commit(cache, new)
      out.append(np.asarray(x))
      if callback is not None:
        callback(c, out[-1])
    return np.concatenate(out, axis=1)


class _PoseLog:
  """Host poses of the frames so far (first batch row), grown by doubling: ``log["c2w"] [F, 4, 4]``,
  ``log["intrinsics"] [F, 3, 3]`` float64 views, as :class:`_SlotBook` reads a rollout's trajectory."""

  def __init__(self):
    self._arrays = {"c2w": np.zeros((16, 4, 4)), "intrinsics": np.zeros((16, 3, 3))}
    self.n = 0

  def add(self, cameras):
    c2w, k = np.asarray(cameras.c2w, np.float64)[0], np.asarray(cameras.intrinsics, np.float64)[0]
    while self.n + len(c2w) > len(self._arrays["c2w"]):
      self._arrays = {name: np.concatenate([a, np.zeros_like(a)]) for name, a in self._arrays.items()}
    self._arrays["c2w"][self.n:self.n + len(c2w)] = c2w
    self._arrays["intrinsics"][self.n:self.n + len(c2w)] = k
    self.n += len(c2w)

  def __getitem__(self, name):
    return self._arrays[name][:self.n]


class Session:
  """Interactive streaming (:meth:`StreamingSampler.session`) under a memory policy.

  ``next(cameras)`` generates the frames of the given cameras (``c2w [B, S, 4, 4]``, ``intrinsics
  [B, S, 3, 3]``, re-anchored on the first frame; ``S`` frames, the chunk size) and returns them as
  host latents ``[B, S, h, w, C]``; chunk ``c`` (from 0) uses noise key ``fold_in(key, c + 1)``, as
  :meth:`StreamingSampler.rollout` does, and the policy sees the same frames and poses in the same order,
  so the frames equal a rollout's on the same poses. A chunk is committed to the cache when the next one's
  cameras arrive (the policy's look-ahead needs them, as the rollout's has them): the commit's cost moves
  from the end of one call to the start of the next. Under a bounded policy (``window``, ``landmark``,
  ``panorama``) a session has no length limit: device memory is the policy's ``slots`` whatever the
  length. ``frames``: every frame so far ``[B, F, h, w, C]`` (with ``keep_frames``; else the latest chunk).
  """

  def __init__(self, sampler, first, key, cameras=None, memory=None, slots=None, keep_frames=True):
    from jaxwm.memory import FullMemory  # pylint: disable=g-import-not-at-top
    self.sampler, self.key, self.keep_frames = sampler, key, keep_frames
    self.memory = FullMemory(sampler.max_frames) if memory is None else memory
    slots = self.memory.capacity if slots is None else slots
    if slots < self.memory.capacity:
      raise ValueError(f"slots={slots} is below the memory policy's capacity {self.memory.capacity}")
    cameras = Cameras.of(cameras)
    self.poses = None
    if cameras is not None:
      validate_cameras(cameras.c2w, cameras.intrinsics)
      self.poses = _PoseLog()
      self.poses.add(cameras)
    self.book = _SlotBook(self.memory, sampler, self.poses, slots)
    self.cache = sampler.start(first, cameras, cache=KVCache.empty(sampler.cfg, sampler.rows, slots,
                                                                   sampler.tokens_per_frame, sampler.cfg.compute_dtype))
    self.num_frames, self.num_chunks = 1, 0
    self._pending = [0]  # frames committed but not yet booked (frame 0: booked with the first chunk's look-ahead)
    self._uncommitted = None  # (frames, x, pos, cams, key, views) of the latest chunk
    self.chunks = [np.asarray(first)]

  def next(self, cameras=None, num_frames=None):
    """The next chunk's frames for ``cameras`` (or ``num_frames`` frames of a model without cameras)."""
    cameras = Cameras.of(cameras)
    if cameras is not None:
      validate_cameras(cameras.c2w, cameras.intrinsics)
      size = int(cameras.c2w.shape[1])
    elif self.sampler.cfg.camera_conditioned:
      raise ValueError("Session.next: this model is camera-conditioned: pass the chunk's cameras")
    else:
      size = num_frames if num_frames is not None else (self.chunks[-1].shape[1] if self.num_chunks else None)
      if size is None:
        raise ValueError("Session.next: pass num_frames for the first chunk of a model without cameras")
    if (self.poses is None) != (cameras is None):
      raise ValueError("Session.next: give cameras for every chunk or for none (as for the first frame)")
    free = getattr(self.memory, "capacity", None)
    if self.memory.name == "full" and self.num_frames + size > free:
      raise ValueError(f"Session.next: {size} frames do not fit the {free - self.num_frames} free cache slots "
                       f"(max_frames={self.sampler.max_frames}); pass a bounded memory policy (window, landmark, "
                       "panorama) or a larger max_frames")
    if self.poses is not None:
      self.poses.add(cameras)  # the look-ahead of the commit below sees these poses
    self.book.chunk_size = size
    if self._pending:  # frame 0
      self.cache = self.book.after_commit(self.cache, self._pending)
      self._pending = []
    if self._uncommitted is not None:
      frames, x, pos, cams, key, views = self._uncommitted
      self._uncommitted = None
      slots = self.book.before_commit(self.cache, frames)
      self.cache = self.book.after_commit(self.sampler.commit_chunk(self.cache, key, x, pos, cams, slots, views),
                                          frames)
    key = _fold_in_jit(self.key, self.num_chunks + 1)
    try:
      x, pos, cams, views = self.sampler.denoise_chunk(self.cache, key, size, cameras, start=self.book.num_resident)
    except Exception:
      if self.poses is not None:  # this chunk never happened: a retry starts from the same state
        self.poses.n -= size
      raise
    frames = list(range(self.num_frames, self.num_frames + size))
    self._uncommitted = (frames, x, pos, cams, key, views)
    self.num_frames += size
    self.num_chunks += 1
    out = np.asarray(x if self.sampler.rows == self.sampler.batch_size else x[:self.sampler.batch_size])
    self.chunks = self.chunks + [out] if self.keep_frames else [out]
    return out

  @property
  def frames(self):
    return np.concatenate(self.chunks, axis=1)


class _SlotBook:
  """Host-side bookkeeping of a rollout under a memory policy: frame -> device slot, host copies
  of banked frames that left the device, compact positions of the resident frames."""

  def __init__(self, policy, sampler, host_cams, slots, chunk_size=1):
    """``host_cams``: ``{"c2w": [F, 4, 4], "intrinsics": [F, 3, 3]}`` of the whole trajectory (a rollout) or a
    :class:`_PoseLog` of the poses so far (a session), or None (a model without cameras)."""
    self.policy, self.sampler, self.cams, self.chunk_size = policy, sampler, host_cams, chunk_size
    self.slot_of, self.host = {}, {}
    self.free = list(range(slots))
    self.num_resident = 0

  def _policy_update(self, new):
    if self.cams is None:
      c2w = np.broadcast_to(np.eye(4), (len(new), 4, 4))
      intr = np.broadcast_to(np.eye(3), (len(new), 3, 3))
    else:
      c2w, intr = self.cams["c2w"][new], self.cams["intrinsics"][new]
    self.policy.update(new, c2w, intr)
    if self.cams is not None and hasattr(self.policy, "look_ahead"):  # the next chunk's poses are known (a
      # MemoryPolicy always has it; a duck-typed policy may not)
      nxt = np.arange(new[-1] + 1, min(new[-1] + 1 + self.chunk_size, len(self.cams["c2w"])))
      if nxt.size:
        self.policy.look_ahead(self.cams["c2w"][nxt])

  def before_commit(self, cache, new):
    """Updates the policy with the chunk's frames, frees the slots of frames that leave (copying
    banked ones to host first) and returns the slots the new frames are committed into."""
    self._policy_update(new)
    resident = set(self.policy.resident())
    if not set(new) <= resident:
      raise ValueError(f"memory policy {self.policy.name!r} must keep the newest chunk resident (frames {new})")
    banked = self.policy.banked()
    for f in sorted(set(self.slot_of) - resident):
      slot = self.slot_of.pop(f)
      if f in banked and f not in self.host:
        self.host[f] = jax.device_get(_read_slot_jit(cache, slot, self.sampler.tokens_per_frame))
      self.free.append(slot)
    if len(self.free) < len(new):
      raise ValueError(f"memory policy {self.policy.name!r} needs more than its capacity {self.policy.capacity}")
    slots = [self.free.pop(0) for _ in new]
    for f, slot in zip(new, slots):
      self.slot_of[f] = slot
    return jnp.asarray(slots, jnp.int32)

  def after_commit(self, cache, new):
    """Brings retrieved frames back from host, drops host copies no longer banked, sets validity
    and compact positions (``0 .. h-1`` in source order)."""
    if not self.slot_of:  # the conditioning frame(s): committed by ``start`` into slots 0..
      self._policy_update(new)
      for i, f in enumerate(new):
        self.slot_of[f] = i
        self.free.remove(i)
    resident = self.policy.resident()
    for f in resident:
      if f not in self.slot_of:
        slot = self.free.pop(0)
        cache = _write_slot_jit(cache, slot, self.host[f], self.sampler.tokens_per_frame)
        self.slot_of[f] = slot
    banked = self.policy.banked()
    self.host = {f: v for f, v in self.host.items() if f in banked}
    slots = np.asarray([self.slot_of[f] for f in resident], np.int32)
    valid = np.zeros(cache.valid.shape, bool)
    valid[:, slots] = True
    pos = np.zeros(cache.valid.shape, np.float32)
    pos[:, slots] = np.arange(len(resident), dtype=np.float32)
    self.num_resident = len(resident)
    return cache.replace(valid=jnp.asarray(valid), pos=jnp.asarray(pos))


_read_slot_jit = jax.jit(KVCache.read_slot, static_argnums=2)
_write_slot_jit = jax.jit(KVCache.write_slot, static_argnums=3, donate_argnums=0)
