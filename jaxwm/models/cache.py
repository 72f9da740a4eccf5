"""The streaming KV cache (docs/design.md §2, §8): a fixed number of frame slots, so every per-chunk
function compiles once whatever the rollout length.

Keys and values are stored *raw* (after the q/k norm, before positions and cameras): each read
encodes them at their slot's position and camera, so a memory policy can give retained frames new
(compact) positions. LOCI hybrid layers keep no keys, only their delta-rule state.
"""

import os
import pathlib

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.models.conditioning import Cameras


@flax.struct.dataclass
class Entries:
  """What one forward produces for the cache.

  ``keys``: per-key entries ``{"k", "v", <encoding extras>}`` of the softmax layers,
  ``[L_softmax, B, S*N, ...]``; ``mem``: LOCI's delta-rule state after this forward's writers,
  ``[L_hybrid, B, H, K, V]`` (None without LOCI); ``selected``: frame-sparse attention's chosen
  history frames ``[L_softmax, B, S, k]`` (None when dense).
  """
  keys: dict
  mem: jax.Array = None
  selected: jax.Array = None


@flax.struct.dataclass
class KVCache:
  """A cache of ``max_frames`` frame slots.

  Attributes:
    keys: ``{"k", "v": [L_softmax, B, max_frames * N, H, Dh]}`` raw keys and values, plus the
      encoding's per-key extras (``CameraEncoding.cache_entries``, e.g. WorldRoPE's Gaussians).
    mem: LOCI's state ``[L_hybrid, B, H, Dh, Dh]`` float32 (written only by commits), or None.
    valid: ``[B, max_frames]`` which slots are attended.
    length: frames committed so far (scalar int32).
    pos: ``[B, max_frames]`` temporal position each slot is read at.
    cameras: :class:`Cameras` of each slot ``[B, max_frames]``.
  """
  keys: dict
  mem: jax.Array
  valid: jax.Array
  length: jax.Array
  pos: jax.Array
  cameras: Cameras

  @classmethod
  def empty(cls, cfg, batch, max_frames, tokens_per_frame, dtype=jnp.float32):
    """An empty cache for model config ``cfg``."""
    lead = (cfg.num_softmax_layers, batch, max_frames * tokens_per_frame)
    keys = {"k": jnp.zeros(lead + (cfg.num_heads, cfg.head_dim), dtype),
            "v": jnp.zeros(lead + (cfg.num_heads, cfg.head_dim), dtype)}
    for name, (tail, dt) in cfg.encoding.cache_entries(cfg).items():
      keys[name] = jnp.zeros(lead + tuple(tail), dt)
    mem = None
    if cfg.num_hybrid_layers:
      mem = jnp.zeros((cfg.num_hybrid_layers, batch, cfg.num_heads, cfg.head_dim, cfg.head_dim), jnp.float32)
    return cls(keys, mem, jnp.zeros((batch, max_frames), bool), jnp.zeros((), jnp.int32),
               jnp.zeros((batch, max_frames), jnp.float32), Cameras.identity(batch, max_frames))

  @property
  def max_frames(self):
    return self.valid.shape[1]

  def write(self, entries, slots, pos, cameras):
    """Stores a committed chunk: its per-key ``entries`` (:class:`Entries`, ``Sc`` frames) into
    ``slots [Sc]``, read at positions ``pos [B, Sc]`` with ``cameras`` ([B, Sc]); LOCI's state
    is replaced. Returns the new cache (``length`` advanced by ``Sc``)."""
    sc = slots.shape[0]
    n = entries.keys["k"].shape[2] // sc
    keys = {}
    for name, buf in self.keys.items():
      new = entries.keys[name].astype(buf.dtype)
      for i in range(sc):
        chunk = jax.lax.slice_in_dim(new, i * n, (i + 1) * n, axis=2)
        buf = jax.lax.dynamic_update_slice_in_dim(buf, chunk, slots[i] * n, axis=2)
      keys[name] = buf
    cams = self.cameras
    if cameras is not None:
      cams = Cameras(cams.c2w.at[:, slots].set(cameras.c2w.astype(cams.c2w.dtype)),
                     cams.intrinsics.at[:, slots].set(cameras.intrinsics.astype(cams.intrinsics.dtype)))
    mem = self.mem if entries.mem is None else entries.mem
    return self.replace(keys=keys, mem=mem, valid=self.valid.at[:, slots].set(True),
                        pos=self.pos.at[:, slots].set(pos.astype(self.pos.dtype)), cameras=cams,
                        length=self.length + sc)

  def read_slot(self, slot, n):
    """One slot's per-key entries and per-frame data (``n`` tokens per frame), e.g. to bank on host."""
    keys = {name: jax.lax.dynamic_slice_in_dim(buf, slot * n, n, axis=2) for name, buf in self.keys.items()}
    frame = lambda a: jax.lax.dynamic_index_in_dim(a, slot, axis=1, keepdims=False)  # pylint: disable=unnecessary-lambda-assignment
    return {"keys": keys, "pos": frame(self.pos), "c2w": frame(self.cameras.c2w),
            "intrinsics": frame(self.cameras.intrinsics)}

  def write_slot(self, slot, data, n):
    """Puts back what :meth:`read_slot` returned into ``slot``."""
    keys = {name: jax.lax.dynamic_update_slice_in_dim(buf, jnp.asarray(data["keys"][name], buf.dtype), slot * n, axis=2)
            for name, buf in self.keys.items()}
    put = lambda buf, val: buf.at[:, slot].set(jnp.asarray(val, buf.dtype))  # pylint: disable=unnecessary-lambda-assignment
    cams = Cameras(put(self.cameras.c2w, data["c2w"]), put(self.cameras.intrinsics, data["intrinsics"]))
    return self.replace(keys=keys, pos=put(self.pos, data["pos"]), cameras=cams)

  def save(self, path):
    """Writes the whole cache to ``path`` (``.npz``) atomically (temporary file, then rename)."""
    path = pathlib.Path(path)
    arrays = {"valid": self.valid, "length": self.length, "pos": self.pos, "c2w": self.cameras.c2w,
              "intrinsics": self.cameras.intrinsics, **{f"keys.{n}": a for n, a in self.keys.items()}}
    if self.mem is not None:
      arrays["mem"] = self.mem
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
      np.savez(f, **{n: np.asarray(a) for n, a in arrays.items()})
    os.replace(tmp, path)
    return path

  @classmethod
  def load(cls, path):
    """Reads a cache written by :meth:`save`."""
    with np.load(path) as z:
      keys = {n[5:]: jnp.asarray(z[n]) for n in z.files if n.startswith("keys.")}
      mem = jnp.asarray(z["mem"]) if "mem" in z.files else None
      return cls(keys, mem, jnp.asarray(z["valid"]), jnp.asarray(z["length"]), jnp.asarray(z["pos"]),
                 Cameras(jnp.asarray(z["c2w"]), jnp.asarray(z["intrinsics"])))
