"""LOCI's recurrent memory branch (LOCI §3-4, App. A; docs/design.md §7).

In a hybrid block the softmax attention sees only the own chunk; this branch adds a gated,
zero-initialised readout of a per-head delta-rule state ``S [K, V]`` that earlier chunks wrote:

- PRoPE inside the memory: ``q <- P^T q``, ``k <- P^-1 k``, ``v <- P^-1 v`` on the temporal
  RoPE block (4x4 tiles; translations divided by ``translation_divisor``, first frame as
  reference), 2-D patch RoPE on the rest (no temporal RoPE), then
  ``N(x) = x / sqrt(|x|^2 + eps)`` on q and k over the whole head; the readout goes back by ``P``.
- ``beta = 2 sigmoid(b(h))`` per token and head.
- Retention once per chunk, at its first token:
  ``log gamma_c = max(-exp(a_h) softplus(W z_c + b_alpha), log alpha_min)`` with ``z_c`` the
  chunk's mean input and first token, ``K/2`` values per head repeated over channel pairs.
- Read before write: every token of chunk ``c`` reads the state from before chunk ``c``.

Which frames write, and in which chunk each frame is, is static (:class:`MemoryPlan`): in the
teacher-forcing layout the clean frames write, in diffusion forcing every frame writes, in a
streaming call the chunk writes (the state a denoising call returns is thrown away; the commit
keeps it).
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm import kernels
from jaxwm.encodings.base import model_poses, tile_transform
from jaxwm.encodings.prope import PRoPE
from jaxwm.encodings.rope3d import apply_rotary, rope_axis_dims
from jaxwm.models.config import CameraConfig
from jaxwm.layers import batch_mesh_axes, dense


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Static chunk structure of one forward: per frame of the sequence, its chunk and whether it writes.

  A frame in chunk ``c`` reads the state after all writing frames of chunks ``< c`` (and the
  incoming state); writers of a chunk write in sequence order.
  """
  chunk: tuple
  writer: tuple

  @classmethod
  def make(cls, chunk, writer):
    chunk, writer = np.asarray(chunk).reshape(-1), np.asarray(writer, bool).reshape(-1)
    if chunk.shape != writer.shape:
      raise ValueError(f"MemoryPlan chunk {chunk.shape} and writer {writer.shape} must have one entry per frame")
    return cls(tuple(int(c) for c in chunk), tuple(bool(w) for w in writer))


def memory_channels(head_dim):
  """``[start, end)`` of the PRoPE tiles: the temporal RoPE block, cut to whole 4-channel tiles."""
  t = rope_axis_dims(head_dim)[0]
  return (0, t - t % 4)


def memory_camera_tensors(cfg, c2w, intrinsics, grid, patch):
  """PRoPE matrices (``TileTensors``: ``g, g_inv [B, L, 4, 4]``) of the memory branch, per frame, from
  ``c2w [B, S, 4, 4]`` with translations divided by ``loci.translation_divisor``."""
  cam = CameraConfig(encoding="prope", channels=(memory_channels(cfg.head_dim),), vae_stride=cfg.camera.vae_stride)
  return PRoPE().tensors(cam, model_poses(c2w, 1.0 / cfg.loci.translation_divisor), intrinsics, grid, patch)


def _normalize(x, eps=1e-6):
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + eps)


def _softplus_inv(y):
  return math.log(math.expm1(y))


class RecurrentMemory(nn.Module):
  """The memory branch of a hybrid block.

  ``__call__(y, cam, rope, state)``: ``y [B, S*N, dim]`` (the block's normalised input),
  ``cam``: ``TileTensors`` (``g, g_inv``) per token, ``rope`` 2-D patch RoPE angles ``[B, S*N, D/2]``,
  ``state [B, H, K, V]`` float32 incoming state. Returns ``(readout [B, S*N, dim] (not yet gated),
  state after this call's writers)``.
  """
  cfg: object
  plan: MemoryPlan

  @nn.compact
  def __call__(self, y, cam, rope, state):
    cfg, lc = self.cfg, self.cfg.loci
    h, d = cfg.num_heads, cfg.head_dim
    b, length, _ = y.shape
    chunk, writer = np.asarray(self.plan.chunk), np.asarray(self.plan.writer)
    n = length // len(chunk)
    q, k, v = (dense(cfg.dim, ("embed", "heads"), f"mem_{name}", jnp.float32)(y).reshape(b, length, h, d)
               for name in ("q", "k", "v"))
    lo, hi = memory_channels(d)
    idx = list(range(lo, hi))
    q = tile_transform(q, jnp.swapaxes(cam.g, -1, -2), idx)
    k = tile_transform(k, cam.g_inv, idx)
    v = tile_transform(v, cam.g_inv, idx)
    q, k = _normalize(apply_rotary(q, rope)), _normalize(apply_rotary(k, rope))
    beta = 2.0 * nn.sigmoid(dense(h, ("embed", "heads"), "mem_beta", jnp.float32)(y))  # [B, L, H]
    w_ret = nn.Dense(h * (d // 2), name="mem_retention", kernel_init=nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ("embed", "heads")), bias_init=nn.with_logical_partitioning(
            nn.initializers.constant(_softplus_inv(-math.log(lc.init_retention))), ("heads",)))
    a = self.param("mem_retention_a", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("heads",)), (h,))

    tok = lambda frames: (np.asarray(frames)[:, None] * n + np.arange(n)).reshape(-1)
    ids = sorted(set(chunk.tolist()))
    before = {}
    for c in ids:
      before[c] = state
      frames = np.flatnonzero((chunk == c) & writer)
      if not len(frames):
        continue
      t = tok(frames)
      yc = y[:, t].astype(jnp.float32)
      z = jnp.concatenate([yc.mean(axis=1), yc[:, 0]], axis=-1)  # chunk mean and first token
      raw = w_ret(z).reshape(b, h, d // 2)
      log_gamma = jnp.maximum(-jnp.exp(a)[None, :, None] * nn.softplus(raw), math.log(lc.alpha_min))
      state = state * jnp.exp(jnp.repeat(log_gamma, 2, axis=-1))[..., None]  # decay once, at the first token
      state = kernels.delta_rule_write(k[:, t], v[:, t], beta[:, t], initial_state=state, chunk_size=lc.chunk_size,
                                       impl=lc.impl, batch_axes=batch_mesh_axes())
    read = jnp.stack([before[c] for c in chunk.tolist()], axis=1)  # [B, S, H, K, V] state read per frame
    qf = q.reshape(b, len(chunk), n, h, d) * d**-0.5
    out = jnp.einsum("bsnhk,bshkv->bsnhv", qf, read).reshape(b, length, h, d)
    out = tile_transform(out, cam.g, idx)
    out = dense(cfg.dim, ("heads", "embed"), "mem_out", cfg.compute_dtype)(out.reshape(b, length, cfg.dim))
    return out, state
