"""umT5 encoder (the text encoder of Wan 2.x) in Flax Linen.

``UMT5Encoder(cfg)(input_ids [B, L], attention_mask [B, L]) -> [B, L, d_model]`` float32, the last
hidden state after the final norm, matching transformers' ``UMT5EncoderModel``. Each layer is

    x = x + SelfAttention(RMSNorm(x)),   x = x + GatedFFN(RMSNorm(x)),

with T5 specifics: ``RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)`` (no mean subtraction, no bias),
unscaled attention logits ``q.k + bias[h, bucket(j - i)] + mask`` (no ``1/sqrt(d_kv)``), and
``GatedFFN(x) = W_o (gelu_tanh(W_0 x) * (W_1 x))``. Unlike T5, every umT5 layer has its own relative
position bias table ``[num_buckets, num_heads]``. The layers are scanned (parameters stacked on a
leading ``layers`` axis under ``params["layers"]``).
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.layers import RMSNorm

_DTYPES = ("float32", "bfloat16", "float16")
_HF_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_num_buckets",
              "relative_attention_max_distance", "feed_forward_proj", "layer_norm_epsilon", "dropout_rate")


@dataclasses.dataclass(frozen=True)
class UMT5Config:
  """Encoder sizes, named as in the Hugging Face ``UMT5Config``; defaults are umT5-XXL as used by Wan.

  ``dropout_rate`` is kept for config round trips and ignored (inference only). ``dtype`` is the
  matmul compute dtype, ``param_dtype`` the parameter dtype (norms, softmax and the residual
  stream stay float32).
  """
  vocab_size: int = 256384
  d_model: int = 4096
  d_kv: int = 64
  d_ff: int = 10240
  num_layers: int = 24
  num_heads: int = 64
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  feed_forward_proj: str = "gated-gelu"
  layer_norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_max_distance"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"UMT5Config.{name}={value!r}: must be a positive int")
    nb = self.relative_attention_num_buckets
    if not isinstance(nb, int) or nb < 4:
      raise ValueError(f"UMT5Config.relative_attention_num_buckets={nb!r}: must be an int >= 4")
    if self.relative_attention_max_distance <= nb // 4:
      raise ValueError(f"UMT5Config.relative_attention_max_distance={self.relative_attention_max_distance}: must "
                       f"exceed relative_attention_num_buckets // 4 = {nb // 4}")
    if self.feed_forward_proj != "gated-gelu":
      raise ValueError(f"UMT5Config.feed_forward_proj={self.feed_forward_proj!r}: only 'gated-gelu' is supported")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"UMT5Config.{name}={getattr(self, name)!r}: must be one of {_DTYPES}")

  @classmethod
  def xxl(cls, **overrides):
    """umT5-XXL (Wan's text encoder): d_model 4096, d_ff 10240, 24 layers, 64 heads, vocab 256384."""
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides):
    """A small random-weight config for tests: d_model 64, 2 layers, 4 heads of 16, vocab 300."""
    kw = dict(vocab_size=300, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
              relative_attention_num_buckets=32, relative_attention_max_distance=128)
    kw.update(overrides)
    return cls(**kw)

  @classmethod
  def from_hf(cls, hf_config, **overrides):
    """From a Hugging Face ``UMT5Config`` (or its ``config.json`` as a dict); unknown fields are ignored."""
    get = hf_config.get if isinstance(hf_config, dict) else lambda k, d=None: getattr(hf_config, k, d)
    kw = {k: get(k) for k in _HF_FIELDS if get(k) is not None}
    kw["dropout_rate"] = float(kw.get("dropout_rate", 0.0))
    kw.update(overrides)
    return cls(**kw)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def params_dtype(self):
    return jnp.dtype(self.param_dtype)


def relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
  """Bidirectional T5 bucket of ``relative_position = key_pos - query_pos`` (integer numpy array).

  With ``n = num_buckets // 2`` and ``e = n // 2``: ``bucket = n * [rel > 0] + b(|rel|)`` where
  ``b(r) = r`` for ``r < e`` and ``b(r) = min(n - 1, e + floor(log(r / e) / log(max_distance / e) * (n - e)))``
  otherwise, evaluated in float32 like the PyTorch reference (host-side numpy, so it is the same
  on every backend).
  """
  rel = np.asarray(relative_position)
  n = num_buckets // 2
  exact = n // 2
  r = np.abs(rel)
  scaled = (np.log(np.maximum(r, 1).astype(np.float32) / np.float32(exact)) /
            np.float32(math.log(max_distance / exact)) * np.float32(n - exact))
  large = np.minimum(exact + scaled.astype(np.int32), n - 1)
  return (rel > 0).astype(np.int32) * n + np.where(r < exact, r, large).astype(np.int32)


def _init(std, axes):
  return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


def _dense(cfg, features, std, axes, name):
  return nn.Dense(features, use_bias=False, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                  kernel_init=_init(std, axes), name=name)


class SelfAttention(nn.Module):
  """Unscaled multi-head self-attention with this layer's own relative position bias.

  ``(x [B, L, D], mask_bias [B, 1, 1, L], buckets [L, L]) -> [B, L, D]`` float32;
  ``softmax_j(q_i . k_j + rel_bias[bucket(j - i), h] + mask_bias_j) v_j``.
  """
  cfg: UMT5Config

  @nn.compact
  def __call__(self, x, mask_bias, buckets):
    cfg = self.cfg
    b, l, d = x.shape
    h, dk = cfg.num_heads, cfg.d_kv
    std_q, std_kv = (d * dk) ** -0.5, d ** -0.5
    q = _dense(cfg, h * dk, std_q, ("embed", "heads"), "q")(x).reshape(b, l, h, dk)
    k = _dense(cfg, h * dk, std_kv, ("embed", "heads"), "k")(x).reshape(b, l, h, dk)
    v = _dense(cfg, h * dk, std_kv, ("embed", "heads"), "v")(x).reshape(b, l, h, dk)
    table = self.param("rel_bias", _init(d ** -0.5, (None, "heads")), (cfg.relative_attention_num_buckets, h),
                       cfg.params_dtype)
    pos = jnp.take(table.astype(jnp.float32), jnp.asarray(buckets), axis=0).transpose(2, 0, 1)  # [H, L, L]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(logits + pos[None] + mask_bias, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(cfg.compute_dtype), v).reshape(b, l, h * dk)
    return _dense(cfg, d, (h * dk) ** -0.5, ("heads", "embed"), "o")(out).astype(jnp.float32)


class GatedFFN(nn.Module):
  """``W_o (gelu_tanh(W_0 x) * W_1 x)``: ``[B, L, D] -> [B, L, D]`` float32."""
  cfg: UMT5Config

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    d = x.shape[-1]
    gate = nn.gelu(_dense(cfg, cfg.d_ff, d ** -0.5, ("embed", "mlp"), "wi_0")(x), approximate=True)
    lin = _dense(cfg, cfg.d_ff, d ** -0.5, ("embed", "mlp"), "wi_1")(x)
    return _dense(cfg, d, cfg.d_ff ** -0.5, ("mlp", "embed"), "wo")(gate * lin).astype(jnp.float32)


class Layer(nn.Module):
  """One pre-norm encoder layer; scanned: ``(x, mask_bias, buckets) -> (x, None)``."""
  cfg: UMT5Config

  @nn.compact
  def __call__(self, x, mask_bias, buckets):
    eps = self.cfg.layer_norm_epsilon
    x = x + SelfAttention(self.cfg, name="attn")(RMSNorm(eps, "embed", name="attn_norm")(x), mask_bias, buckets)
    x = x + GatedFFN(self.cfg, name="ffn")(RMSNorm(eps, "embed", name="ffn_norm")(x))
    return x, None


class UMT5Encoder(nn.Module):
  """umT5 encoder stack: ``(input_ids [B, L] int, attention_mask [B, L] or None) -> [B, L, d_model]`` float32.

  ``attention_mask`` is 1 for real tokens and 0 for padding; padded keys get ``finfo(float32).min``
  added to their logits (as in the reference), so they receive no attention. Outputs at padded
  positions are computed but meaningless (callers zero them, see :mod:`jaxwm.text`).
  """
  cfg: UMT5Config

  @nn.compact
  def __call__(self, input_ids, attention_mask=None):
    cfg = self.cfg
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids has shape {input_ids.shape}: must be [batch, length]")
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    if attention_mask.shape != input_ids.shape:
      raise ValueError(f"attention_mask has shape {attention_mask.shape}: must match input_ids {input_ids.shape}")
    length = input_ids.shape[1]
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=jnp.float32, param_dtype=cfg.params_dtype,
                     embedding_init=_init(1.0, ("vocab", "embed")), name="token_embedding")
    x = embed(input_ids).astype(jnp.float32)
    mask_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
    pos = np.arange(length)
    buckets = relative_position_bucket(pos[None, :] - pos[:, None], cfg.relative_attention_num_buckets,
                                       cfg.relative_attention_max_distance)
    stack = nn.scan(Layer, variable_axes={"params": 0, "intermediates": 0}, split_rngs={"params": True},
                    in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})(cfg, name="layers")
    x, _ = stack(x, mask_bias, buckets)
    return RMSNorm(cfg.layer_norm_epsilon, "embed", name="final_norm")(x)
