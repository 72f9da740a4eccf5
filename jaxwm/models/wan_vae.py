"""The Wan video VAEs in Flax Linen: Wan2.1 (8x8 spatial, 4x temporal, 16 channels) and Wan2.2 (16x16 =
patchify 2 + 8x8, 4x temporal, 48 channels, residual down/up blocks with parameter-free avg-down/dup-up
shortcuts), equal to diffusers' ``AutoencoderKLWan`` up to float32 rounding.

Layout is channels-last: video ``[B, F, H, W, 3]`` in ``[-1, 1]`` <-> latents ``[B, 1 + (F-1)//4, H/s, W/s, z]``.
Wan compresses causally: frame 0 alone, then groups of 4 frames per latent frame; every temporal
convolution is padded with past frames only. So a clip can be decoded (or encoded) chunk by chunk with a
:class:`StreamState` of fixed shape (the past frames each causal convolution needs) and give the
whole-clip result::

  vae = WanVAE(WanVAEConfig.wan22())
  step = jax.jit(functools.partial(vae.apply, method=WanVAE.decode_step), donate_argnums=1)
  state = vae.decode_init(batch, h, w)           # h, w: latent size
  for z in latent_chunks:                         # [B, n, h, w, 48]: n = 1, 2, ... (static per compile)
    state, rgb = step(variables, state, z)        # [B, 4n, 16h, 16w, 3] (first chunk: 4n - 3 frames)
"""

import dataclasses
import functools
from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.models.wan_vae_blocks import Decoder, Encoder, decoder_plan, dense, encoder_plan

WAN21_LATENTS_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
                      -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_LATENTS_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                     1.6382, 1.1253, 2.8251, 1.9160)
WAN22_LATENTS_MEAN = (-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
                      0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
                      -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
                      -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
                      0.3573, -0.0548, -0.1681, -0.0667)
WAN22_LATENTS_STD = (0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
                     0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
                     0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
                     0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744)
_IGNORED_DIFFUSERS_KEYS = ("clip_output",)


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
  """Hyper-parameters; field names and meanings are those of diffusers' ``AutoencoderKLWan`` config.

  Attributes:
    base_dim: encoder width of the first level (widths ``base_dim * [1, *dim_mult]``).
    decoder_base_dim: decoder base width (``None``: ``base_dim``; Wan2.2 uses a wider decoder).
    z_dim: latent channels.
    dim_mult: width multipliers per level; ``len(dim_mult) - 1`` 2x spatial resamplings.
    num_res_blocks: residual blocks per encoder level (the decoder has one more).
    attn_scales: must be ``()``: attention only in the mid-blocks (every released Wan VAE; diffusers cannot
      run other values either).
    temperal_downsample: per resampling level, whether it also halves time (diffusers' spelling).
    dropout: unused (inference).
    latents_mean, latents_std: per-channel latent statistics for :func:`normalize`.
    is_residual: Wan2.2 residual blocks with avg-down/dup-up shortcuts.
    in_channels, out_channels: channels the encoder reads and the decoder writes, after patchify
      (``3 * patch_size**2``).
    patch_size: pixel-unshuffle factor before the encoder (Wan2.2: 2; ``None``: none).
    scale_factor_temporal, scale_factor_spatial: the compression factors (checked against the structure).
  """
  base_dim: int = 96
  decoder_base_dim: Optional[int] = None
  z_dim: int = 16
  dim_mult: tuple = (1, 2, 4, 4)
  num_res_blocks: int = 2
  attn_scales: tuple = ()
  temperal_downsample: tuple = (False, True, True)
  dropout: float = 0.0
  latents_mean: tuple = WAN21_LATENTS_MEAN
  latents_std: tuple = WAN21_LATENTS_STD
  is_residual: bool = False
  in_channels: int = 3
  out_channels: int = 3
  patch_size: Optional[int] = None
  scale_factor_temporal: int = 4
  scale_factor_spatial: int = 8

  def __post_init__(self):
    for name in ("dim_mult", "attn_scales", "temperal_downsample", "latents_mean", "latents_std"):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    object.__setattr__(self, "temperal_downsample", tuple(bool(t) for t in self.temperal_downsample))
    for name in ("base_dim", "z_dim", "num_res_blocks", "in_channels", "out_channels"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"WanVAEConfig.{name}={getattr(self, name)!r}: must be a positive integer")
    if not self.dim_mult or min(self.dim_mult) < 1:
      raise ValueError(f"WanVAEConfig.dim_mult={self.dim_mult!r}: must be a non-empty list of positive integers")
    if self.attn_scales:
      raise ValueError(f"WanVAEConfig.attn_scales={self.attn_scales!r}: only () is supported (attention in the "
                       "mid-blocks only, as every released Wan VAE)")
    if len(self.temperal_downsample) != len(self.dim_mult) - 1:
      raise ValueError(f"WanVAEConfig.temperal_downsample={self.temperal_downsample!r}: needs "
                       f"len(dim_mult) - 1 = {len(self.dim_mult) - 1} entries")
    if self.patch_size is not None and int(self.patch_size) < 1:
      raise ValueError(f"WanVAEConfig.patch_size={self.patch_size!r}: must be None or a positive integer")
    p2 = self.patch**2
    if self.in_channels % p2 or self.out_channels % p2:
      raise ValueError(f"WanVAEConfig.in_channels={self.in_channels}, out_channels={self.out_channels}: must be "
                       f"multiples of patch_size**2 = {p2}")
    for name in ("latents_mean", "latents_std"):
      if len(getattr(self, name)) != self.z_dim:
        raise ValueError(f"WanVAEConfig.{name} has {len(getattr(self, name))} entries: needs z_dim = {self.z_dim}")
    if min(self.latents_std) <= 0:
      raise ValueError(f"WanVAEConfig.latents_std={self.latents_std!r}: must be positive")
    st, ss = 2**sum(self.temperal_downsample), self.patch * 2**(len(self.dim_mult) - 1)
    if self.scale_factor_temporal != st:
      raise ValueError(f"WanVAEConfig.scale_factor_temporal={self.scale_factor_temporal}: the structure "
                       f"(temperal_downsample={self.temperal_downsample}) compresses time by {st}")
    if self.scale_factor_spatial != ss:
      raise ValueError(f"WanVAEConfig.scale_factor_spatial={self.scale_factor_spatial}: the structure "
                       f"(patch_size={self.patch_size}, dim_mult={self.dim_mult}) compresses space by {ss}")
    encoder_plan(self), decoder_plan(self)  # pylint: disable=expression-not-assigned  # shortcut divisibility

  @property
  def patch(self):
    return int(self.patch_size or 1)

  @classmethod
  def wan21(cls):
    """Wan2.1's VAE (``Wan2.1_VAE.pth``; diffusers ``Wan-AI/Wan2.1-T2V-*-Diffusers/vae``): 127M parameters."""
    return cls()

  @classmethod
  def wan22(cls):
    """Wan2.2-TI2V-5B's VAE (``Wan2.2_VAE.pth``): base 160, decoder 256, 48 latent channels, 16x16 spatial."""
    return cls(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, in_channels=12, out_channels=12,
               patch_size=2, scale_factor_spatial=16, latents_mean=WAN22_LATENTS_MEAN, latents_std=WAN22_LATENTS_STD)

  @classmethod
  def tiny_wan21(cls, base_dim=8, z_dim=4, num_res_blocks=2):
    """Wan2.1's structure at test size (same levels and resamplings, narrow)."""
    return cls(base_dim=base_dim, z_dim=z_dim, num_res_blocks=num_res_blocks, **_stats(z_dim))

  @classmethod
  def tiny_wan22(cls, base_dim=8, decoder_base_dim=16, z_dim=8, num_res_blocks=1):
    """Wan2.2's structure at test size (residual blocks, patchify 2, 16x16 spatial)."""
    return cls(base_dim=base_dim, decoder_base_dim=decoder_base_dim, z_dim=z_dim, num_res_blocks=num_res_blocks,
               is_residual=True, in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
               **_stats(z_dim))

  @classmethod
  def from_diffusers(cls, config):
    """From a diffusers ``vae/config.json`` dict (keys starting with ``_`` are skipped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in dict(config).items() if not k.startswith("_") and k not in _IGNORED_DIFFUSERS_KEYS}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"WanVAEConfig.from_diffusers: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    return cls(**d)

  def to_diffusers(self):
    """Keyword arguments for diffusers' ``AutoencoderKLWan(**kwargs)``."""
    d = dataclasses.asdict(self)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _stats(z):
  return {"latents_mean": tuple(round(-0.5 + i / max(z - 1, 1), 4) for i in range(z)),
          "latents_std": tuple(round(0.5 + i / max(z - 1, 1), 4) for i in range(z))}


def normalize(latents, cfg):
  """Wan's latent normalisation ``(z - mean) * (1 / std)`` per channel (last axis)."""
  mean = jnp.asarray(cfg.latents_mean, jnp.float32)
  inv_std = 1.0 / jnp.asarray(cfg.latents_std, jnp.float32)
  return (latents - mean) * inv_std


def denormalize(latents, cfg):
  """Inverse of :func:`normalize`: ``z / (1 / std) + mean`` (as diffusers' Wan pipelines)."""
  mean = jnp.asarray(cfg.latents_mean, jnp.float32)
  inv_std = 1.0 / jnp.asarray(cfg.latents_std, jnp.float32)
  return latents / inv_std + mean


def patchify(x, p):
  """``[B, F, H, W, C] -> [B, F, H/p, W/p, C p^2]``, channel index ``c p^2 + j p + i`` for the pixel
  ``(i, j)`` of each ``p x p`` patch (Wan's ``b c f (h q) (w r) -> b (c r q) f h w``)."""
  if p == 1:
    return x
  b, f, h, w, c = x.shape
  x = x.reshape(b, f, h // p, p, w // p, p, c).transpose(0, 1, 2, 4, 6, 5, 3)
  return x.reshape(b, f, h // p, w // p, c * p * p)


def unpatchify(x, p):
  """Inverse of :func:`patchify`."""
  if p == 1:
    return x
  b, f, h, w, cp = x.shape
  x = x.reshape(b, f, h, w, cp // (p * p), p, p).transpose(0, 1, 2, 6, 3, 5, 4)
  return x.reshape(b, f, h * p, w * p, cp // (p * p))


@flax.struct.dataclass
class StreamState:
  """What chunked encoding/decoding carries between chunks: ``layers``, a dict (by module path) of the past
  input frames of each causal convolution, fixed shapes; ``started`` (static): whether a first chunk (which
  treats frame 0 specially) has gone through."""
  layers: Any
  started: bool = flax.struct.field(pytree_node=False, default=False)


class WanVAE(nn.Module):
  """The Wan2.1 / Wan2.2 causal video VAE (diffusers ``AutoencoderKLWan``), channels-last.

  ``dtype`` is the compute dtype (parameters stay float32; norms and softmax run in float32).
  ``vae.init(key, video)`` creates the parameters (any clip, e.g. ``[1, 1, s, s, 3]``); ``__call__`` is the
  reconstruction ``decode(encode(video)[0])``.
  """
  cfg: WanVAEConfig
  dtype: Any = jnp.float32

  def setup(self):
    z = self.cfg.z_dim
    self.encoder = Encoder(self.cfg, self.dtype)
    self.quant_conv = dense(2 * z, None, self.dtype)
    self.post_quant_conv = dense(z, None, self.dtype)
    self.decoder = Decoder(self.cfg, self.dtype)

  def __call__(self, video):
    return self.decode(self.encode(video)[0])

  def encode(self, video):
    """Video ``[B, F, H, W, 3]`` in ``[-1, 1]`` -> posterior ``(mean, logvar)``, each ``[B, 1 + (F-1)//4, H/s, W/s,
    z_dim]`` float32 (trailing frames beyond ``1 + 4k`` are dropped, as diffusers does; logvar clipped to
    ``[-30, 20]``)."""
    ft = self.cfg.scale_factor_temporal
    video = video[:, :1 + (video.shape[1] - 1) // ft * ft]
    _, mean, logvar = self._encode(video, None, True)
    return mean, logvar

  def decode(self, latents):
    """Latents ``[B, T, h, w, z_dim]`` (unnormalised) -> video ``[B, 1 + 4 (T-1), s h, s w, 3]`` float32 in
    ``[-1, 1]``."""
    return self._decode(latents, None, True)[1]

  def encode_step(self, state, video):
    """Encodes the next chunk of a clip: ``(StreamState, [B, n, H, W, 3]) -> (StreamState, (mean, logvar))``.

    The first chunk has ``1 + 4k`` frames (``k >= 0``), later ones ``4k`` (``k >= 1``), giving ``1 + k`` resp. ``k``
    latent frames; concatenated they equal :meth:`encode` of the whole clip.
    """
    n, ft = video.shape[1], self.cfg.scale_factor_temporal
    if (n - 1 if not state.started else n) % ft or n < (1 if not state.started else ft):
      raise ValueError(f"encode_step: video chunk of {n} frames; the first chunk needs 1 + {ft}k frames, later ones "
                       f"{ft}k (k >= 1)")
    layers, mean, logvar = self._encode(video, state.layers if state.started else None, not state.started)
    return StreamState(layers, True), (mean, logvar)

  def decode_step(self, state, latents):
    """Decodes the next latent chunk: ``(StreamState, [B, n, h, w, z_dim]) -> (StreamState, video)``.

    ``video`` has ``4n`` frames (``4n - 3`` for a clip's first chunk); concatenated they equal :meth:`decode`
    of the whole latent clip. Memory is constant in the clip length. Jit it with the chunk length static (one
    compile for the first chunk, one for later chunks of each length).
    """
    if latents.shape[1] < 1:
      raise ValueError("decode_step: latent chunk of 0 frames; needs at least 1")
    layers, video = self._decode(latents, state.layers if state.started else None, not state.started)
    return StreamState(layers, True), video

  def decode_init(self, batch, height, width):
    """Zero :class:`StreamState` for :meth:`decode_step` of ``[batch, *, height, width, z_dim]`` latents (the first
    step only reads its shapes). Allocates the state; ``jax.eval_shape(lambda: vae.decode_init(...))`` does not."""
    return _zero_state(self.cfg, self.dtype, "_decode", (batch, 1, height, width, self.cfg.z_dim))

  def encode_init(self, batch, height, width):
    """Zero :class:`StreamState` for :meth:`encode_step` of ``[batch, *, height, width, 3]`` video."""
    c = self.cfg.in_channels // self.cfg.patch**2
    return _zero_state(self.cfg, self.dtype, "_encode", (batch, self.cfg.scale_factor_temporal, height, width, c))

  def normalize(self, latents):
    """:func:`normalize` with this VAE's statistics."""
    return normalize(latents, self.cfg)

  def denormalize(self, latents):
    """:func:`denormalize` with this VAE's statistics."""
    return denormalize(latents, self.cfg)

  def _check_hw(self, h, w, what, stride):
    if h % stride or w % stride:
      raise ValueError(f"WanVAE: {what} size {(h, w)} must be a multiple of {stride}")

  def _encode(self, video, layers, first):
    self._check_hw(video.shape[2], video.shape[3], "video", self.cfg.scale_factor_spatial)
    x = patchify(video.astype(self.dtype), self.cfg.patch)
    h, layers = self.encoder(x, layers, first)
    mean, logvar = jnp.split(self.quant_conv(h).astype(jnp.float32), 2, axis=-1)
    return layers, mean, jnp.clip(logvar, -30.0, 20.0)

  def _decode(self, latents, layers, first):
    x, layers = self.decoder(self.post_quant_conv(latents.astype(self.dtype)), layers, first)
    return layers, jnp.clip(unpatchify(x, self.cfg.patch).astype(jnp.float32), -1.0, 1.0)


@functools.lru_cache(maxsize=16)
def _state_shapes(cfg, dtype, method, shape):
  """Shapes of the stream state after one later-chunk step of ``method`` on an input of ``shape`` (traced once)."""
  vae = WanVAE(cfg, dtype, parent=None)  # unbound even when called from a bound method

  def layers(x):
    out, _ = vae.init_with_output(jax.random.key(0), x, None, False, method=getattr(WanVAE, method))
    return out[0]

  return jax.eval_shape(layers, jax.ShapeDtypeStruct(shape, dtype))


def _zero_state(cfg, dtype, method, shape):
  shapes = _state_shapes(cfg, dtype, method, tuple(shape))
  return StreamState(jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), False)
