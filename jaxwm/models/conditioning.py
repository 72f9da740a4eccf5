"""Typed inputs of the model: the frames of one forward and their cameras.

A forward sees a *frame sequence* (``[B, S, h, w, C]`` latents): per frame a temporal RoPE position,
a camera, which key frames it may attend (``mask``; keys are ``[cache slots; these frames]``), its
own chunk (``local``: always attended by frame-sparse attention and by LOCI hybrid blocks) and, for
LOCI, the static chunk structure of the recurrent memory (``plan``). docs/design.md §2, §5.
"""

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Cameras:
  """``c2w [B, S, 4, 4]`` camera-to-world (OpenCV axes, re-anchored on the clip's first frame) and
  ``intrinsics [B, S, 3, 3]`` in pixels of the frames."""
  c2w: jax.Array
  intrinsics: jax.Array

  @classmethod
  def of(cls, cameras):
    """A :class:`Cameras` from one, from a mapping with ``c2w`` and ``intrinsics``, or None."""
    if cameras is None or isinstance(cameras, Cameras):
      return cameras
    return cls(jnp.asarray(cameras["c2w"], jnp.float32), jnp.asarray(cameras["intrinsics"], jnp.float32))

  @classmethod
  def identity(cls, batch, frames, focal=1.0, centre=0.0):
    """Identity poses and a pinhole ``[[f, 0, c], [0, f, c], [0, 0, 1]]`` (placeholders)."""
    k = jnp.array([[focal, 0.0, centre], [0.0, focal, centre], [0.0, 0.0, 1.0]])
    return cls(jnp.broadcast_to(jnp.eye(4), (batch, frames, 4, 4)), jnp.broadcast_to(k, (batch, frames, 3, 3)))

  def frames(self, idx):
    """The cameras of frames ``idx`` (an index array or slice along the frame axis)."""
    return Cameras(self.c2w[:, idx], self.intrinsics[:, idx])

  def rows(self, n):
    """The batch repeated ``n`` times (classifier-free guidance rows)."""
    return Cameras(jnp.concatenate([self.c2w] * n), jnp.concatenate([self.intrinsics] * n)) if n > 1 else self


@flax.struct.dataclass
class Frames:
  """The frames of one forward.

  Attributes:
    pos: ``[B, S]`` temporal RoPE positions.
    cameras: :class:`Cameras` ``[B, S]`` (camera-conditioned models), or None.
    mask: frame-level bool ``[B, S, M + S]`` (True = attend; ``M`` cache slots first), per head
      ``[B, H, S, M + S]`` (ReWorld's head windows), or None (everything).
    local: ``[B, S, C]`` int: the key frames (indices into ``[cache slots; these frames]``) of each
      frame's own chunk, -1 pads. Frame-sparse attention always attends them and selects among the
      rest of ``mask`` (ViewRope Eq. 11); LOCI hybrid blocks attend them only.
    plan: LOCI's static :class:`jaxwm.models.loci.MemoryPlan` (chunk and writer flag per frame).
    static_mask: ``mask`` as a :class:`jaxwm.ops.attention.StaticFrameMask` when it is known at trace time and
      shared by the batch (a training layout's own mask); dense attention then passes it to the kernel, which
      need not build the token mask (splash).
  """
  pos: jax.Array
  cameras: Cameras = None
  mask: jax.Array = None
  local: jax.Array = None
  plan: object = flax.struct.field(pytree_node=False, default=None)
  static_mask: object = flax.struct.field(pytree_node=False, default=None)

  @classmethod
  def sequence(cls, batch, num_frames, **kw):
    """Frames at positions ``0 .. num_frames - 1``."""
    return cls(pos=jnp.broadcast_to(jnp.arange(num_frames, dtype=jnp.float32), (batch, num_frames)), **kw)
