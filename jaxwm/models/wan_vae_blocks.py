"""Building blocks of the Wan video VAEs (Wan2.1 and Wan2.2), channels-last ``[B, T, H, W, C]``.

Only causal convolutions mix frames; norms and attention act per frame. Every module that looks
at the past takes and returns its *stream state* (a dict of arrays, ``None`` at the start of a
clip): the last input frames each causal convolution needs. Feeding a clip in pieces with the
state threaded through gives the output of feeding it whole (up to float rounding).

The one irregularity is Wan's first frame, which is compressed on its own: with ``first=True``
the temporal resamplers pass frame 0 through unchanged (encoder: ``[x0, conv(x0,x1,x2),
conv(x2,x3,x4), ...]``; decoder: ``[x0, interleave(conv([0, 0, x1, x2, ...]))]``), so ``1 + 4n``
frames map to ``1 + n`` latents and back.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax import lax


def _precision(dtype):
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


class Conv(nn.Module):
  """N-d convolution without time padding, channels-last; kernel ``[*kernel_size, C_in, features]``.

  ``padding`` pads the spatial axes only (time is the caller's business). When the input has fewer
  frames than the temporal kernel the output has zero frames (only used with 1x1 or "same" spatial
  kernels, which keep the spatial size).
  """
  features: int
  kernel_size: tuple
  strides: tuple = None
  padding: tuple = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    k = tuple(self.kernel_size)
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (*k, x.shape[-1], self.features), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
    if len(k) == 3 and x.shape[1] < k[0]:
      return jnp.zeros((*x.shape[:1], 0, *x.shape[2:-1], self.features), self.dtype)
    pad = tuple(self.padding) if self.padding is not None else ((0, 0),) * len(k)
    dn = ("NHWC", "HWIO", "NHWC") if len(k) == 2 else ("NDHWC", "DHWIO", "NDHWC")
    y = lax.conv_general_dilated(x.astype(self.dtype), kernel.astype(self.dtype), self.strides or (1,) * len(k), pad,
                                 dimension_numbers=dn, precision=_precision(self.dtype))
    return y + bias.astype(self.dtype)


def causal(conv, x, past, frames):
  """Runs ``conv`` (no time padding) on ``[past, x]`` along time; ``past``: the ``frames`` input frames before
  ``x`` (``None``: zeros, the start of a clip). Returns ``(y, last frames of [past, x])``."""
  if past is None:
    past = jnp.zeros((*x.shape[:1], frames, *x.shape[2:]), x.dtype)
  x = jnp.concatenate([past.astype(x.dtype), x], axis=1)
  return conv(x), x[:, x.shape[1] - frames:]


def causal_conv3(parent, name, features, x, past):
  """Wan's ``CausalConv3d`` with kernel 3 (a :class:`Conv` named ``name`` under ``parent``): "same" in space,
  2 past frames in time. Returns ``(y, past')``."""
  conv = Conv(features, (3, 3, 3), padding=((0, 0), (1, 1), (1, 1)), dtype=parent.dtype, name=name)
  return causal(conv, x, past, 2)


def dense(features, name, dtype):
  """A pointwise convolution (torch ``Conv{2,3}d`` with kernel 1)."""
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, precision=_precision(dtype), name=name)


class RMSNorm(nn.Module):
  """Wan's ``RMS_norm`` over channels: ``x / max(||x||_2, 1e-12) * sqrt(C) * scale``, in float32."""

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones_init(), (c,), jnp.float32)
    xf = x.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(xf * xf, axis=-1, keepdims=True))
    return (xf / jnp.maximum(norm, 1e-12) * (c**0.5) * scale).astype(x.dtype)


class ResidualBlock(nn.Module):
  """``x + conv2(silu(norm2(conv1(silu(norm1(x))))))`` with causal 3x3x3 convolutions (a pointwise
  shortcut when the width changes). State: ``{"conv1": past, "conv2": past}``."""
  out_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, state=None):
    state = state or {}
    h = x if x.shape[-1] == self.out_dim else dense(self.out_dim, "conv_shortcut", self.dtype)(x)
    y = nn.silu(RMSNorm(name="norm1")(x))
    y, p1 = causal_conv3(self, "conv1", self.out_dim, y, state.get("conv1"))
    y = nn.silu(RMSNorm(name="norm2")(y))
    y, p2 = causal_conv3(self, "conv2", self.out_dim, y, state.get("conv2"))
    return (y + h).astype(x.dtype), {"conv1": p1, "conv2": p2}


class AttentionBlock(nn.Module):
  """Single-head self-attention over the ``H*W`` positions of each frame, residual: ``x + proj(attn(norm(x)))``."""
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    b, t, h, w, c = x.shape
    qkv = dense(3 * c, "to_qkv", self.dtype)(RMSNorm(name="norm")(x)).reshape(b * t, h * w, 1, 3 * c)
    q, k, v = jnp.split(qkv, 3, axis=-1)
    y = nn.dot_product_attention(q, k, v, precision=_precision(self.dtype), force_fp32_for_softmax=True)
    y = y.reshape(b, t, h, w, c)
    return x + dense(c, "proj", self.dtype)(y).astype(x.dtype)


class MidBlock(nn.Module):
  """``resnets_0 -> attentions_0 -> resnets_1`` at the lowest resolution."""
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, state=None):
    state = state or {}
    c = x.shape[-1]
    x, s0 = ResidualBlock(c, self.dtype, name="resnets_0")(x, state.get("resnets_0"))
    x = AttentionBlock(self.dtype, name="attentions_0")(x)
    x, s1 = ResidualBlock(c, self.dtype, name="resnets_1")(x, state.get("resnets_1"))
    return x, {"resnets_0": s0, "resnets_1": s1}


class Resample(nn.Module):
  """Wan's ``Resample``: 2x spatial down (pad right/bottom, 3x3 stride 2) or up (nearest, 3x3 to ``out_dim``),
  with a temporal 2x for the ``3d`` modes:

  - ``downsample3d`` (after the spatial step): ``time_conv`` (3,1,1) with stride 2 over ``[last frame, x]``;
    state: the last input frame ``[B, 1, h, w, C]``.
  - ``upsample3d`` (before the spatial step): ``time_conv`` (3,1,1) to ``2C`` channels, split into two
    interleaved frames; causal with 2 past frames (state ``[B, 2, h, w, C]``).

  With ``first`` (the first chunk of a clip) frame 0 skips the temporal step.
  """
  mode: str
  out_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, state=None, first=False):
    state = state or {}
    b, t, h, w, c = x.shape
    new = {}
    if self.mode == "upsample3d":
      conv = Conv(2 * c, (3, 1, 1), dtype=self.dtype, name="time_conv")
      head, rest = (x[:, :1], x[:, 1:]) if first else (x[:, :0], x)
      y, new["time_conv"] = causal(conv, rest, state.get("time_conv"), 2)
      n = y.shape[1]
      y = y.reshape(b, n, h, w, 2, c).transpose(0, 1, 4, 2, 3, 5).reshape(b, 2 * n, h, w, c)
      x = jnp.concatenate([head, y.astype(x.dtype)], axis=1)
      t = x.shape[1]
    x = x.reshape(b * t, h, w, c)
    if self.mode.startswith("up"):
      x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
      x = Conv(self.out_dim, (3, 3), padding=((1, 1), (1, 1)), dtype=self.dtype, name="resample")(x)
    else:
      x = Conv(c, (3, 3), strides=(2, 2), padding=((0, 1), (0, 1)), dtype=self.dtype, name="resample")(x)
    x = x.reshape(b, t, *x.shape[1:])
    if self.mode == "downsample3d":
      conv = Conv(x.shape[-1], (3, 1, 1), strides=(2, 1, 1), dtype=self.dtype, name="time_conv")
      if first:
        x, new["time_conv"] = jnp.concatenate([x[:, :1], conv(x)], axis=1), x[:, -1:]
      else:
        past = state.get("time_conv")
        past = jnp.zeros_like(x[:, :1]) if past is None else past.astype(x.dtype)
        x, new["time_conv"] = conv(jnp.concatenate([past, x], axis=1)), x[:, -1:]
    return x, new


def avg_down(x, out_dim, factor_t, factor_s):
  """Wan2.2's parameter-free shortcut: ``factor_t x factor_s^2`` space/time-to-channel, then the mean of each
  group of consecutive channels down to ``out_dim``. Time is zero-padded in front to a multiple of ``factor_t``."""
  pad = (-x.shape[1]) % factor_t
  x = jnp.pad(x, ((0, 0), (pad, 0), (0, 0), (0, 0), (0, 0)))
  b, t, h, w, c = x.shape
  x = x.reshape(b, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s, c)
  x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6).reshape(b, t // factor_t, h // factor_s, w // factor_s, out_dim, -1)
  return x.mean(-1)


def dup_up(x, out_dim, factor_t, factor_s, first):
  """Inverse layout of :func:`avg_down`: channels repeated, then unfolded into ``factor_t`` frames and
  ``factor_s^2`` pixels. On a clip's first chunk the first ``factor_t - 1`` frames are dropped."""
  b, t, h, w, c = x.shape
  x = jnp.repeat(x, out_dim * factor_t * factor_s * factor_s // c, axis=-1)
  x = x.reshape(b, t, h, w, out_dim, factor_t, factor_s, factor_s).transpose(0, 1, 5, 2, 6, 3, 7, 4)
  x = x.reshape(b, t * factor_t, h * factor_s, w * factor_s, out_dim)
  return x[:, factor_t - 1:] if first else x


@dataclasses.dataclass(frozen=True)
class Stage:
  """One entry of an encoder/decoder plan (names follow diffusers' ``AutoencoderKLWan``).

  kind: ``res`` (ResidualBlock) and ``resample`` (Resample): Wan2.1 encoder entries; ``up``: a Wan2.1 decoder
  block (resnets + ``upsamplers_0``); ``res_down`` / ``res_up``: Wan2.2 blocks with the avg-down / dup-up
  shortcut.
  """
  kind: str
  in_dim: int
  out_dim: int
  num_res: int = 0
  mode: str = None  # resample mode, None: no resampling
  factor_t: int = 1


def encoder_plan(cfg):
  """The encoder's ``down_blocks`` as :class:`Stage` s (diffusers' ``WanEncoder3d`` layout)."""
  dims = [cfg.base_dim * u for u in (1, *cfg.dim_mult)]
  last = len(cfg.dim_mult) - 1
  plan = []
  for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
    mode = None if i == last else ("downsample3d" if cfg.temperal_downsample[i] else "downsample2d")
    if cfg.is_residual:
      ft = 2 if mode == "downsample3d" else 1
      fs = 2 if mode else 1
      if cin * ft * fs * fs % cout:
        raise ValueError(f"WanVAEConfig.base_dim={cfg.base_dim}, dim_mult={cfg.dim_mult}: the avg-down shortcut of "
                         f"block {i} needs {cin} x {ft * fs * fs} divisible by {cout}")
      plan.append(Stage("res_down", cin, cout, cfg.num_res_blocks, mode, ft))
      continue
    for _ in range(cfg.num_res_blocks):
      plan.append(Stage("res", cin, cout))
      cin = cout
    if mode:
      plan.append(Stage("resample", cout, cout, mode=mode))
  return plan


def decoder_plan(cfg):
  """The decoder's ``up_blocks`` as :class:`Stage` s (diffusers' ``WanDecoder3d`` layout)."""
  base = cfg.decoder_base_dim or cfg.base_dim
  mult = tuple(cfg.dim_mult)
  dims = [base * u for u in (mult[-1], *mult[::-1])]
  up_t = tuple(cfg.temperal_downsample)[::-1]
  last = len(mult) - 1
  plan = []
  for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
    mode = None if i == last else ("upsample3d" if up_t[i] else "upsample2d")
    if cfg.is_residual:
      ft = 2 if mode == "upsample3d" else 1
      if mode and cout * ft * 4 % cin:
        raise ValueError(f"WanVAEConfig.decoder_base_dim={base}, dim_mult={cfg.dim_mult}: the dup-up shortcut of "
                         f"block {i} needs {cout} x {ft * 4} divisible by {cin}")
      plan.append(Stage("res_up", cin, cout, cfg.num_res_blocks + 1, mode, ft))
    else:
      plan.append(Stage("up", cin // 2 if i > 0 else cin, cout, cfg.num_res_blocks + 1, mode))
  return plan


class ResidualDownBlock(nn.Module):
  """Wan2.2 encoder block: resnets, an optional :class:`Resample` (``downsampler``), plus :func:`avg_down` of
  the block input."""
  stage: Stage
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, state=None, first=False):
    state, new, s = state or {}, {}, self.stage
    skip = avg_down(x, s.out_dim, s.factor_t, 2 if s.mode else 1)
    for j in range(s.num_res):
      x, new[f"resnets_{j}"] = ResidualBlock(s.out_dim, self.dtype, name=f"resnets_{j}")(x, state.get(f"resnets_{j}"))
    if s.mode:
      x, new["downsampler"] = Resample(s.mode, s.out_dim, self.dtype, name="downsampler")(
          x, state.get("downsampler"), first)
    return x + skip.astype(x.dtype), new


class UpBlock(nn.Module):
  """Decoder block: ``num_res`` resnets then an optional :class:`Resample`. Wan2.1 (``up``): the resample
  (``upsamplers_0``) halves the width. Wan2.2 (``res_up``): it keeps the width (``upsampler``) and the block
  adds :func:`dup_up` of its input."""
  stage: Stage
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, state=None, first=False):
    state, new, s = state or {}, {}, self.stage
    x_in = x
    for j in range(s.num_res):
      x, new[f"resnets_{j}"] = ResidualBlock(s.out_dim, self.dtype, name=f"resnets_{j}")(x, state.get(f"resnets_{j}"))
    if s.mode:
      name, out = ("upsampler", s.out_dim) if s.kind == "res_up" else ("upsamplers_0", s.out_dim // 2)
      x, new[name] = Resample(s.mode, out, self.dtype, name=name)(x, state.get(name), first)
      if s.kind == "res_up":
        x = x + dup_up(x_in, s.out_dim, s.factor_t, 2, first).astype(x.dtype)
    return x, new


class Encoder(nn.Module):
  """Video (patchified) ``[B, T, H, W, in_channels]`` -> ``[B, T', H/8, W/8, 2 z_dim]`` (mean and log-variance
  before ``quant_conv``). ``(x, state, first) -> (y, state')``."""
  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, state=None, first=False):
    cfg, state, new = self.cfg, state or {}, {}
    x, new["conv_in"] = causal_conv3(self, "conv_in", cfg.base_dim, x, state.get("conv_in"))
    for k, s in enumerate(encoder_plan(cfg)):
      name = f"down_blocks_{k}"
      if s.kind == "res":
        x, new[name] = ResidualBlock(s.out_dim, self.dtype, name=name)(x, state.get(name))
      elif s.kind == "resample":
        x, new[name] = Resample(s.mode, s.out_dim, self.dtype, name=name)(x, state.get(name), first)
      else:
        x, new[name] = ResidualDownBlock(s, self.dtype, name=name)(x, state.get(name), first)
    x, new["mid_block"] = MidBlock(self.dtype, name="mid_block")(x, state.get("mid_block"))
    x = nn.silu(RMSNorm(name="norm_out")(x))
    x, new["conv_out"] = causal_conv3(self, "conv_out", 2 * cfg.z_dim, x, state.get("conv_out"))
    return x, new


class Decoder(nn.Module):
  """Latents (after ``post_quant_conv``) ``[B, T, h, w, z_dim]`` -> ``[B, T', 8h, 8w, out_channels]`` (before
  unpatchify and clipping). ``(z, state, first) -> (y, state')``."""
  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, state=None, first=False):
    cfg, state, new = self.cfg, state or {}, {}
    plan = decoder_plan(cfg)
    x, new["conv_in"] = causal_conv3(self, "conv_in", plan[0].in_dim, x, state.get("conv_in"))
    x, new["mid_block"] = MidBlock(self.dtype, name="mid_block")(x, state.get("mid_block"))
    for k, s in enumerate(plan):
      name = f"up_blocks_{k}"
      x, new[name] = UpBlock(s, self.dtype, name=name)(x, state.get(name), first)
    x = nn.silu(RMSNorm(name="norm_out")(x))
    x, new["conv_out"] = causal_conv3(self, "conv_out", cfg.out_channels, x, state.get("conv_out"))
    return x, new
