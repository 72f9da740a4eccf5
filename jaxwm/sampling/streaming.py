"""Streaming generation (DESIGN §2): per chunk, ``S`` Euler steps of the current chunk against a
KV cache that is read, never written, while denoising; then one commit forward of the
finished chunk (clean, ``t = 0``) that writes its keys and values.

Caches are fixed-size buffers plus a validity mask and a length, so every per-chunk function
compiles once, whatever the rollout length. Classifier-free guidance runs the conditional and
unconditional branches as one doubled batch, each with its own cache rows.
"""

import os
import pathlib

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.diffusion import flow
from jaxwm.encodings.camera import trajectory_scale
from jaxwm.geometry.validate import validate_cameras
from jaxwm.models.loci import MemoryPlan
from jaxwm.models.transformer import WanModel


WHOLE_ENTRIES = ("mem",)  # replaced by a commit (recurrent state), not appended per token


@flax.struct.dataclass
class KVCache:
  """A fixed-size cache of ``max_frames`` frame slots.

  ``k, v``: ``[num_layers, B, max_frames * N, H, Dh]`` raw keys/values (positions and cameras are
  applied when read); ``valid``: ``[B, max_frames]`` which slots attend; ``length``: frames
  committed so far; ``frames``: per slot ``pos [B, max_frames]`` (the temporal position the slot
  is read at), ``c2w [B, max_frames, 4, 4]``, ``intrinsics [B, max_frames, 3, 3]``; ``aux``: further
  per-key entries (WorldRoPE's ``wr_mean``, ``wr_cov``, ``wr_alpha``) and LOCI's delta-rule state
  ``mem [num_layers, B, H, K, V]`` float32, which only a commit writes."""
  k: jax.Array
  v: jax.Array
  valid: jax.Array
  length: jax.Array
  frames: dict
  aux: dict = flax.struct.field(default_factory=dict)

  @classmethod
  def empty(cls, cfg, batch, max_frames, tokens_per_frame, dtype=jnp.float32):
    lead = (cfg.num_layers, batch, max_frames * tokens_per_frame)
    shape = lead + (cfg.num_heads, cfg.head_dim)
    aux = {}
    if cfg.loci.enabled:  # the delta-rule state of every block (used by the hybrid ones)
      aux["mem"] = jnp.zeros((cfg.num_layers, batch, cfg.num_heads, cfg.head_dim, cfg.head_dim), jnp.float32)
    if cfg.camera.encoding == "worldrope":
      m = cfg.camera.hypotheses
      aux.update({"wr_mean": jnp.zeros(lead + (m, 3)), "wr_cov": jnp.zeros(lead + (m, 3, 3)),
                  "wr_alpha": jnp.zeros(lead + (m,))})
    frames = {"pos": jnp.zeros((batch, max_frames), jnp.float32),
              "c2w": jnp.broadcast_to(jnp.eye(4), (batch, max_frames, 4, 4)),
              "intrinsics": jnp.broadcast_to(jnp.eye(3), (batch, max_frames, 3, 3))}
    return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, max_frames), bool),
               jnp.zeros((), jnp.int32), frames, aux)

  def entries(self):
    return {"k": self.k, "v": self.v, **self.aux}

  def save(self, path):
    """Writes the whole cache (keys, values, validity, length and aux entries such as LOCI's
    recurrent state ``mem``) to ``path`` (``.npz``), atomically (temporary file, then rename)."""
    path = pathlib.Path(path)
    arrays = {"k": self.k, "v": self.v, "valid": self.valid, "length": self.length,
              **{f"aux.{n}": a for n, a in self.aux.items()}, **{f"frames.{n}": a for n, a in self.frames.items()}}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
      np.savez(f, **{n: np.asarray(a) for n, a in arrays.items()})
    os.replace(tmp, path)
    return path

  @classmethod
  def load(cls, path):
    """Reads a cache written by :meth:`save`."""
    with np.load(path) as z:
      aux = {n[4:]: jnp.asarray(z[n]) for n in z.files if n.startswith("aux.")}
      frames = {n[7:]: jnp.asarray(z[n]) for n in z.files if n.startswith("frames.")}
      return cls(jnp.asarray(z["k"]), jnp.asarray(z["v"]), jnp.asarray(z["valid"]), jnp.asarray(z["length"]),
                 frames, aux)


def chunk_forward(model, variables, cache, x, t, frame_pos, context=None, cameras=None, rng=None):
  """Velocity of chunk ``x [B, Sc, h, w, C]`` at time ``t`` (``[B, Sc]`` in ``[0, 1]``) against ``cache``.

  ``cameras`` are the chunk's own (``c2w``, ``intrinsics`` ``[B, Sc, ...]``, ``scale [B]``):
  queries get their camera's transform, cached keys keep theirs. With frame-sparse attention
  the chunk attends to itself and selects among the cache's valid frames (at every call);
  ``rng`` feeds the ``frame_select`` stream (sampled positions, random selection modes).

  Returns ``(velocity, entries)`` with the chunk's own keys/values per layer (and, when
  sparse, ``selected [layers, B, Sc, k]`` cache-frame indices).
  """
  b, sc = x.shape[:2]
  cap = cache.valid.shape[1]
  mask = jnp.concatenate([jnp.broadcast_to(cache.valid[:, None, :], (b, sc, cap)),
                          jnp.ones((b, sc, sc), bool)], axis=-1)
  local = jnp.broadcast_to(cap + jnp.arange(sc, dtype=jnp.int32), (b, sc, sc))
  rngs = None if rng is None else {"frame_select": rng}
  plan = MemoryPlan.make(np.ones(sc, int), np.ones(sc, bool)) if model.cfg.loci.enabled else None
  return model.apply(variables, x, t * flow.TIMESTEP_SCALE, frame_pos=frame_pos, mask=mask, context=context,
                     cache=cache.entries(), cameras=cameras, local=local, rngs=rngs, memory_plan=plan,
                     cache_frames=cache.frames)


def commit(model, variables, cache, x, frame_pos, context=None, cameras=None, rng=None, slots=None):
  """Writes the raw keys/values of clean chunk ``x`` (forward at ``t = 0``) into cache slots.

  ``slots``: ``[Sc]`` int slot of each frame (default: the next ones, ``length .. length+Sc-1``);
  the slots' positions are ``frame_pos`` and their cameras the chunk's.
  """
  b, sc = x.shape[:2]
  _, own = chunk_forward(model, variables, cache, x, jnp.zeros((b, sc)), frame_pos, context, cameras, rng)
  n = own["k"].shape[2] // sc
  slots = cache.length + jnp.arange(sc) if slots is None else jnp.asarray(slots, jnp.int32)
  new = {}
  for name, buf in cache.entries().items():
    val = own[name].astype(buf.dtype)
    if name not in WHOLE_ENTRIES:
      for i in range(sc):
        val_i = jax.lax.slice_in_dim(own[name].astype(buf.dtype), i * n, (i + 1) * n, axis=2)
        buf = jax.lax.dynamic_update_slice_in_dim(buf, val_i, slots[i] * n, axis=2)
      val = buf
    new[name] = val
  cams = cameras or {}
  chunk_frames = {"pos": frame_pos.astype(jnp.float32),
                  "c2w": cams.get("c2w", jnp.broadcast_to(jnp.eye(4), (b, sc, 4, 4))),
                  "intrinsics": cams.get("intrinsics", jnp.broadcast_to(jnp.eye(3), (b, sc, 3, 3)))}
  frames = {name: buf.at[:, slots].set(chunk_frames[name].astype(buf.dtype)) for name, buf in cache.frames.items()}
  return cache.replace(k=new.pop("k"), v=new.pop("v"), aux=new, valid=cache.valid.at[:, slots].set(True),
                       frames=frames, length=cache.length + sc)


def denoise(model, variables, cache, noise, frame_pos, schedule, context=None, guidance=1.0, cameras=None, rng=None):
  """Euler integration of a chunk from ``schedule[0] = 1`` to ``schedule[-1] = 0``; the cache is only read.

  ``rng``: the ``frame_select`` stream, folded with the step index (frame-sparse models).

  With ``guidance != 1`` the batch holds ``[conditional; unconditional]`` halves (contexts and
  cache rows alike) and ``v = v_u + guidance (v_c - v_u)`` is applied to both halves.
  """
  b, sc = noise.shape[:2]

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
_normal_jit = jax.jit(jax.random.normal, static_argnums=1)  # eager random ops compile several programs


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
  """

  def __init__(self, model: WanModel, variables, *, batch_size, max_frames, latent_hw, channels, num_steps=20,
               shift=1.0, guidance=1.0, context=None, null_context=None):
    cfg = model.cfg
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
    if cameras is None:
      if self.cfg.camera_conditioned:
        raise ValueError(f"this model is camera-conditioned (model.camera.encoding={self.cfg.camera.encoding!r}, "
                         f"plucker={self.cfg.camera.plucker}): pass cameras")
      return None
    return jax.tree_util.tree_map(self._rows, dict(cameras))

  def start(self, first, cameras=None):
    """Commits the conditioning frame(s) ``first [B, S0, h, w, C]`` at positions ``0..S0-1``."""
    pos = jnp.broadcast_to(jnp.arange(first.shape[1], dtype=jnp.float32), (self.rows, first.shape[1]))
    return _commit_jit(self.model, self.variables, self.empty_cache(), self._rows(first), pos, self.context,
                       self._cams(cameras))

  def generate(self, cache, key, num_frames, cameras=None):
    """Generates the next ``num_frames`` frames after the cache's frames; returns ``(latents, cache)``.

    ``cameras``: the new frames' ``c2w``/``intrinsics`` ``[B, num_frames, ...]`` and ``scale [B]``.
    """
    shape = (self.batch_size, num_frames, *self.latent_hw, self.channels)
    z = self._rows(_normal_jit(key, shape))
    start = cache.length.astype(jnp.float32)
    pos = jnp.broadcast_to(start + jnp.arange(num_frames, dtype=jnp.float32), (self.rows, num_frames))
    cams = self._cams(cameras)
    sparse = self.cfg.attention.sparse
    x = _denoise_jit(model=self.model, variables=self.variables, cache=cache, noise=z, frame_pos=pos,
                     schedule=self.schedule, context=self.context, guidance=self.guidance, cameras=cams,
                     rng=jax.random.fold_in(key, 1) if sparse else None)
    cache = _commit_jit(self.model, self.variables, cache, x, pos, self.context, cams,
                        jax.random.fold_in(key, 2) if sparse else None)
    return x[:self.batch_size], cache

  def rollout(self, first, num_frames, chunk_size, key, cameras=None):
    """``first [B, 1, h, w, C]`` -> ``[B, num_frames, h, w, C]`` (frame 0 is ``first``), chunk by chunk.

    ``num_frames = 1 + k * chunk_size``; chunk ``c`` uses noise key ``fold_in(key, c)``.
    ``cameras``: the whole trajectory, ``c2w [B, F, 4, 4]`` (re-anchored on frame 0) and
    ``intrinsics [B, F, 3, 3]``; its translation scale is computed once over all frames.
    """
    if (num_frames - 1) % chunk_size:
      raise ValueError(f"num_frames={num_frames} must be 1 + k * chunk_size (chunk_size={chunk_size})")
    if num_frames > self.max_frames:
      raise ValueError(f"num_frames={num_frames} exceeds the cache capacity max_frames={self.max_frames}")
    def frames(lo, hi):
      if cameras is None:
        return None
      return {"c2w": cameras["c2w"][:, lo:hi], "intrinsics": cameras["intrinsics"][:, lo:hi], "scale": scale}

    scale = None
    if cameras is not None:
      validate_cameras(cameras["c2w"], cameras["intrinsics"])
      scale = cameras.get("scale", trajectory_scale(jnp.asarray(cameras["c2w"])))
      cameras = {k: jnp.asarray(cameras[k], jnp.float32) for k in ("c2w", "intrinsics")}
    cache = self.start(first, frames(0, 1))
    out = [first]
    for c in range((num_frames - 1) // chunk_size):
      lo = 1 + c * chunk_size
      x, cache = self.generate(cache, jax.random.fold_in(key, c + 1), chunk_size, frames(lo, lo + chunk_size))
      out.append(x)
    return jnp.concatenate(out, axis=1)
