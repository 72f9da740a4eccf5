"""The interface every camera encoding implements, and the helpers they share.

An encoding transforms a range of head channels (``jaxwm.encodings.channels``) of the queries,
keys (and for some the values and the attention output) by per-token camera tensors, on top of
the backbone RoPE (docs/design.md §4). The transformer calls only the methods below, so adding an
encoding is one new file with a :class:`CameraEncoding` subclass and one line in
``jaxwm.encodings.registry``.

Cameras reach the encodings as :func:`model_poses`: re-anchored ``c2w`` with translations times the
fixed ``model.camera.translation_scale``. Nothing depends on other frames of the clip or
trajectory, so the normalisation is causal and identical in training and streaming.
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.encodings.channels import channel_index, resolve_channels
from jaxwm.geometry.cameras import pixel_rays, token_pixel_centers
from jaxwm.geometry.rotations import make_se3, rotation_z_to


@flax.struct.dataclass
class Encoded:
  """What attention needs of one set of frames (the queries', or the cached keys').

  ``rope``: backbone RoPE angles ``[B, L, (H,) D/2]`` (with any encoding offsets, e.g. MRoPE);
  ``cam``: the encoding's per-token tensors (:meth:`CameraEncoding.tensors`), or None.
  """
  rope: jax.Array
  cam: object = None


class ChannelPlan:
  """Static channel bookkeeping of a model's camera encoding: channel indices ``idx``, whether the
  backbone RoPE is switched off there (``replace``) and the RoPE pairs they touch (``pair_mask``)."""

  def __init__(self, cam_cfg, head_dim):
    from jaxwm.encodings.registry import get_encoding  # pylint: disable=g-import-not-at-top
    enc = get_encoding(cam_cfg.encoding)
    if not enc.uses_channels:
      self.idx, self.replace = [], False
    else:
      ranges, self.replace = resolve_channels(cam_cfg.channels, head_dim, cam_cfg.encoding, enc.unit)
      self.idx = channel_index(ranges)
    pair_mask = np.zeros(head_dim // 2, bool)
    for c in self.idx:
      pair_mask[c // 2] = True
    self.pair_mask = pair_mask


class CameraEncoding:
  """Base class: the identity encoding (no camera). Subclasses override what they change.

  Attributes:
    name: the ``model.camera.encoding`` value.
    unit: channels transformed together (3 for rotations, 4 for SE(3)/projective tiles, 2 for pairs).
    uses_channels: the encoding acts on ``model.camera.channels`` (validated at config read).
    needs_cameras: the model must be given cameras.
    per_view_keys: keys depend on the query view (WorldRoPE): attention is the encoding's own
      (:meth:`attend`), and frame-sparse attention and LOCI memory are not available.
  """
  name = "base"
  unit = 1
  uses_channels = True
  needs_cameras = True
  per_view_keys = False

  def check(self, cfg):
    """Extra checks of a ``ModelConfig`` (raise ``ValueError`` naming the key and value)."""

  def tensors(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    """Per-token tensors ``[B, S*N, ...]`` from ``c2w [B, S, 4, 4]`` (:func:`model_poses`) and
    ``intrinsics [B, S, 3, 3]`` (pixels); ``grid_hw`` token grid, ``patch_hw`` patch size."""
    return None

  def model_params(self, cfg):
    """Creates parameters in the model's scope (called once per forward); returns them or None."""
    return None

  def rope_offsets(self, cfg, params, c2w):
    """``[B, S, H, D/2]`` phases added to the RoPE angles of frames with poses ``c2w``, or None."""
    return None

  def attention_params(self, cfg):
    """Creates parameters in an attention layer's scope (once per call); returns them or None."""
    return None

  def encode_q(self, q, cam, plan):
    """``q [B, L, H, D]`` -> transformed queries."""
    return q

  def encode_kv(self, k, v, cam, plan, params):
    """Raw ``k, v [B, L, H, D]`` of frames with tensors ``cam`` -> transformed ``(k, v)``."""
    return k, v

  def decode(self, out, cam, plan, params):
    """Attention output ``[B, L, H, D]`` -> ``(out, residual)``; ``residual [B, L, dim]`` (or None)
    is added after the output projection."""
    return out, None

  def cache_entries(self, cfg):
    """Extra per-key entries the streaming cache keeps: ``{name: (trailing shape, dtype)}``."""
    return {}

  def cache_views(self, cfg, cache_keys, c2w, intrinsics):
    """Per-layer tensors of the cached keys as seen from the query frames (``c2w [B, Fq, 4, 4]`` model poses,
    ``intrinsics [B, Fq, 3, 3]``), computed once per streamed chunk: the cache and the chunk's cameras do not
    change while it is denoised. ``{name: [L_softmax, B, ...]}`` passed to :meth:`attend` in ``cache_kv``, or
    ``{}`` (nothing to hoist)."""
    return {}


class NoCamera(CameraEncoding):
  """``rope3d``: no camera encoding, the backbone's 3D RoPE alone (the baseline)."""
  name = "rope3d"
  uses_channels = False
  needs_cameras = False


ENCODING = NoCamera()


def model_poses(c2w, translation_scale):
  """The poses every encoding reads: ``c2w [..., 4, 4]`` with translations times ``translation_scale``
  (a fixed number: the per-frame result depends on nothing but the frame's own pose)."""
  c2w = c2w.astype(jnp.float32)
  return make_se3(c2w[..., :3, :3], c2w[..., :3, 3] * translation_scale)


def per_token(a, n):
  """``[B, S, ...]`` per frame -> ``[B, S * n, ...]`` per token."""
  return jnp.repeat(a, n, axis=1)


def ray_frames(intrinsics, grid_hw, patch_hw, vae_stride):
  """``R_local [B, S, N, 3, 3]``: the minimal rotation taking +z to each token's viewing ray (ViewRope Eq. 5)."""
  rays = pixel_rays(intrinsics.astype(jnp.float32),
                    token_pixel_centers(grid_hw, patch_hw, (vae_stride, vae_stride), xp=jnp))
  return rotation_z_to(rays).reshape(rays.shape[:2] + (grid_hw[0] * grid_hw[1], 3, 3))


def tile_transform(x, mat, idx):
  """Applies ``mat [B, L, 4, 4]`` to the 4-channel tiles ``idx`` of ``x [B, L, H, D]``: ``t <- mat t``."""
  sub = x[..., idx].astype(jnp.float32)
  sub = sub.reshape(sub.shape[:-1] + (len(idx) // 4, 4))
  out = jnp.einsum("blij,blhmj->blhmi", mat.astype(jnp.float32), sub)
  return x.at[..., idx].set(out.reshape(out.shape[:-2] + (len(idx),)).astype(x.dtype))
