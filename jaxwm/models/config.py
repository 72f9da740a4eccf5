"""Model hyper-parameters (a frozen dataclass built from the ml-collections ``model`` block)."""

import dataclasses

import jax.numpy as jnp

REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "dots_and_kernels")
# How the model is computed, not what it computes: a resume may change these fields (logged); any other model
# field is refused (jaxwm.training.resume).
RUNTIME = {"resume": "logged"}


def _checked_fields(cls, d, where):
  """``dict(d)``, raising ``ValueError`` on keys that are not fields of dataclass ``cls``."""
  d = dict(d)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(f"unknown {where} config key(s) {unknown}; valid keys: {sorted(names)}")
  return d


@dataclasses.dataclass(frozen=True)
class CameraConfig:
  """How cameras condition the model (docs/design.md §4).

  Attributes:
    encoding: a name in ``jaxwm.encodings.registry`` (``rope3d``: none, the backbone RoPE only;
      ``viewrope``, ``gta``, ``prope``, ``mrope``, ``worldrope``).
    channels: a placement name (``t_low``, ``hw_low``, ``hw_low_replace``, ``all``) or a list
      of ``[start, end)`` head-channel ranges; see ``jaxwm.encodings.channels``.
    per_token: GTA/PRoPE: one transform per token (the ray's local frame) instead of per frame.
    translation_scale: every encoding (and Plücker) reads translations multiplied by this fixed
      number (no per-clip rescaling: causal, and the same in training and streaming).
    plucker: Plücker action injection into the patch embeddings (ReWorld §2.2), zero-initialised.
    vae_stride: pixels per latent pixel (token pixel centres and PRoPE's image size).
    mrope_hidden: width of MRoPE's pose MLP.
    hypotheses: WorldRoPE depth hypotheses per key token (M).
    depth_range: WorldRoPE initial depths, spread evenly over ``[lo, hi]`` (scene units).
    mixed_frequencies: WorldRoPE mixed (golden-angle) instead of axial 2-D frequencies.
  """
  encoding: str = "rope3d"
  channels: object = "t_low"
  per_token: bool = False
  translation_scale: float = 1.0
  plucker: bool = False
  vae_stride: int = 4
  mrope_hidden: int = 64
  hypotheses: int = 4
  depth_range: tuple = (1.0, 6.0)
  mixed_frequencies: bool = False

  @classmethod
  def from_dict(cls, d):
    d = _checked_fields(cls, d, "model.camera")
    if isinstance(d.get("channels"), (list, tuple)):
      d["channels"] = tuple(tuple(r) for r in d["channels"])
    if "depth_range" in d:
      d["depth_range"] = tuple(d["depth_range"])
    return cls(**d)


SPARSITIES = ("dense", "sliding_window", "frame_topk")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """Which history frames self-attention reads (docs/design.md §6; ViewRope §3.3).

  Attributes:
    sparsity: ``dense`` (the whole chunk-causal history), ``sliding_window`` (the latest
      ``window`` history frames) or ``frame_topk`` (the ``top_k`` most relevant history
      frames by Eq. 9); the query's own chunk is always attended.
    top_k: history frames per query frame for ``frame_topk``.
    num_samples: token positions per frame used to score relevance (``K_s``).
    window: history frames for ``sliding_window``.
    selection: ``topk`` | ``random`` | ``exclude_selected`` (Table 4's counterfactuals; the
      random modes need an rng stream ``frame_select``).
    impl: ``xla`` (the ``jnp`` reference) | ``pallas_tpu`` | ``pallas_gpu``.
    interpret: run the Pallas kernels in interpret mode (CPU).
  """
  sparsity: str = "dense"
  top_k: int = 5
  num_samples: int = 10
  window: int = 4
  selection: str = "topk"
  impl: str = dataclasses.field(default="xla", metadata=RUNTIME)
  interpret: bool = dataclasses.field(default=False, metadata=RUNTIME)

  def __post_init__(self):
    from jaxwm import kernels  # pylint: disable=g-import-not-at-top
    from jaxwm.ops import frame_sparse  # pylint: disable=g-import-not-at-top
    if self.sparsity not in SPARSITIES:
      raise ValueError(f"model.attention.sparsity must be one of {SPARSITIES}; got {self.sparsity!r}")
    if self.selection not in frame_sparse.SELECTION_MODES:
      raise ValueError(f"model.attention.selection must be one of {frame_sparse.SELECTION_MODES}; "
                       f"got {self.selection!r}")
    if self.impl not in kernels.impls("frame_sparse_attention"):
      raise ValueError(f"model.attention.impl must be one of {kernels.impls('frame_sparse_attention')}; "
                       f"got {self.impl!r}")
    for name in ("top_k", "num_samples", "window"):
      if getattr(self, name) < 1:
        raise ValueError(f"model.attention.{name} must be >= 1; got {getattr(self, name)}")

  @property
  def sparse(self):
    return self.sparsity != "dense"

  @classmethod
  def from_dict(cls, d):
    return cls(**_checked_fields(cls, d, "model.attention"))


LOCI_BLOCKS_30 = (2, 4, 6, 7, 8, 9, 11, 13, 14, 16, 23, 24, 25, 27, 28)


@dataclasses.dataclass(frozen=True)
class LociConfig:
  """LOCI's hybrid blocks (docs/design.md §7; LOCI §3-4, App. A): intra-chunk softmax attention plus a
  gated, zero-initialised delta-rule memory read before the chunk writes.

  Attributes:
    enabled: turn the hybrid blocks on.
    blocks: zero-based hybrid block indices (default: LOCI's 15 of 30); the other blocks keep
      softmax attention over the history.
    alpha_min: floor of the per-chunk retention.
    init_retention: initial per-chunk retention ``r_0`` (``b_alpha = softplus^-1(-log r_0)``).
    translation_divisor: camera translations are divided by this (LOCI: 6 m) for the memory's PRoPE.
    chunk_size: scan chunk of the memory's write (``jaxwm.kernels.delta_rule_write``): 16 is the XLA form's
      fastest on CPU (``benchmarks/delta_rule.py``), 64 suits the Pallas kernels (``configs/loci_5b.py``).
    impl: ``xla`` | ``pallas_tpu`` | ``pallas_gpu`` | ``cpu_flash`` (the C++ kernel for XLA:CPU) for the delta-rule
      scan.
  """
  enabled: bool = False
  blocks: tuple = LOCI_BLOCKS_30
  alpha_min: float = 0.2
  init_retention: float = 0.7
  translation_divisor: float = 6.0
  chunk_size: int = dataclasses.field(default=16, metadata=RUNTIME)
  impl: str = dataclasses.field(default="xla", metadata=RUNTIME)

  def __post_init__(self):
    if not 0 < self.alpha_min < 1 or not 0 < self.init_retention < 1:
      raise ValueError(f"model.loci.alpha_min ({self.alpha_min}) and init_retention ({self.init_retention}) "
                       "must lie in (0, 1)")
    if self.translation_divisor <= 0:
      raise ValueError(f"model.loci.translation_divisor must be > 0; got {self.translation_divisor}")
    from jaxwm import kernels  # pylint: disable=g-import-not-at-top
    if self.impl not in kernels.impls("delta_rule"):
      raise ValueError(f"model.loci.impl must be one of {kernels.impls('delta_rule')}; got {self.impl!r}")

  @classmethod
  def from_dict(cls, d):
    d = _checked_fields(cls, d, "model.loci")
    if "blocks" in d:
      d["blocks"] = tuple(int(b) for b in d["blocks"])
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Wan 2.x DiT shape and options.

  Attributes:
    dim: model width ``num_heads * head_dim``.
    num_heads, head_dim, num_layers, ffn_dim: transformer shape.
    in_channels, out_channels: latent channels.
    patch_size: ``(pt, ph, pw)``; jaxwm's streaming layouts need ``pt = 1``.
    text_dim: width of the conditioning sequence (text embeddings).
    freq_dim: sinusoidal timestep embedding size.
    eps: norm epsilon.
    cross_attn: whether blocks have cross-attention to a conditioning sequence.
    cross_attn_norm: LayerNorm (with affine) before cross-attention.
    rope_theta: RoPE base.
    dtype: compute dtype name (``float32`` / ``bfloat16``); parameters stay float32.
    remat: rematerialisation policy of the scanned blocks (:data:`REMAT_POLICIES`): ``none`` keeps every residual,
      ``full`` none (the 5B configs), ``dots_saveable`` / ``dots_with_no_batch_dims_saveable`` jax's policies,
      ``dots_and_kernels`` the matmuls without batch dimensions and the custom kernels' outputs, recomputing the
      elementwise rest (``jaxwm.models.transformer.dots_and_kernels_saveable``).
    scan_unroll: layers per iteration of the layer scan (``num_layers`` unrolls it fully).
    attention_impl: self-attention (``jaxwm.kernels.dot_product_attention``; WorldRoPE's
      ``jaxwm.kernels.per_view_attention``): ``xla`` (the reference) | ``xla_lse`` (its maths, a backward keeping
      the log-sum-exp, not the probabilities) | ``cpu_flash`` (the same as one C++ kernel for XLA:CPU, built with
      g++ at first use; float32, masks shared by the heads) | ``splash`` (TPU splash attention;
      ``attention.interpret`` runs it on CPU) | ``cudnn`` (GPU) | ``auto`` (the default: the fastest that takes
      the inputs where the program runs, ``jaxwm.kernels.resolve_attention_impl``; on CPU ``cpu_flash``, or
      ``xla_lse`` where it does not apply or no C++ compiler is found).
    attention: frame sparsity of self-attention (:class:`AttentionConfig`).
    loci: LOCI hybrid blocks with recurrent memory (:class:`LociConfig`).
  """
  dim: int = 128
  num_heads: int = 4
  num_layers: int = 4
  ffn_dim: int = 512
  in_channels: int = 48
  out_channels: int = 48
  patch_size: tuple = (1, 2, 2)
  text_dim: int = 64
  freq_dim: int = 64
  eps: float = 1e-6
  cross_attn: bool = False
  cross_attn_norm: bool = True
  rope_theta: float = 10000.0
  dtype: str = dataclasses.field(default="float32", metadata=RUNTIME)
  remat: str = dataclasses.field(default="dots_and_kernels", metadata=RUNTIME)
  scan_unroll: int = dataclasses.field(default=1, metadata=RUNTIME)
  attention_impl: str = dataclasses.field(default="auto", metadata=RUNTIME)
  camera: CameraConfig = CameraConfig()
  attention: AttentionConfig = AttentionConfig()
  loci: LociConfig = LociConfig()

  def __post_init__(self):
    if self.dim % self.num_heads:
      raise ValueError(f"model.dim={self.dim} is not divisible by model.num_heads={self.num_heads}")
    if self.head_dim % 2 or self.head_dim < 6:
      raise ValueError(f"head dim {self.head_dim} (model.dim / model.num_heads) must be even and >= 6 for 3D RoPE")
    if len(self.patch_size) != 3 or min(self.patch_size) < 1:
      raise ValueError(f"model.patch_size must be three positive ints; got {self.patch_size}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"model.remat must be one of {REMAT_POLICIES}; got {self.remat!r}")
    if self.dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(f"model.dtype must be float32, bfloat16 or float16; got {self.dtype!r}")
    enc = self.encoding
    if enc.uses_channels:
      from jaxwm.encodings.channels import resolve_channels  # pylint: disable=g-import-not-at-top
      resolve_channels(self.camera.channels, self.head_dim, enc.name, enc.unit)
    enc.check(self)
    if self.attention.sparse and enc.per_view_keys:
      raise ValueError(f"model.attention.sparsity={self.attention.sparsity!r} is not supported with "
                       f"model.camera.encoding={enc.name!r} (its keys depend on the query view); use sparsity='dense'")
    if self.loci.enabled:
      bad = [b for b in self.loci.blocks if not 0 <= b < self.num_layers]
      if bad or not self.loci.blocks:
        raise ValueError(f"model.loci.blocks {list(self.loci.blocks)} must be non-empty indices in "
                         f"[0, model.num_layers={self.num_layers})")
      if enc.per_view_keys:
        raise ValueError(f"model.loci is not supported with model.camera.encoding={enc.name!r} "
                         "(keys depend on the query view)")
    if self.attention.sparse and self.patch_size[0] != 1:
      raise ValueError(f"frame-sparse attention needs model.patch_size[0] == 1; got {self.patch_size}")

  @property
  def encoding(self):
    """The :class:`jaxwm.encodings.base.CameraEncoding` of ``camera.encoding``."""
    from jaxwm.encodings.registry import get_encoding  # pylint: disable=g-import-not-at-top
    return get_encoding(self.camera.encoding)

  @property
  def camera_conditioned(self):
    return self.encoding.needs_cameras or self.camera.plucker or self.loci.enabled

  @property
  def layer_kinds(self):
    """Per layer ``"softmax"`` (attention over the history) or ``"hybrid"`` (LOCI: own chunk + memory)."""
    hybrid = set(self.loci.blocks) if self.loci.enabled else set()
    return tuple("hybrid" if i in hybrid else "softmax" for i in range(self.num_layers))

  @property
  def layer_groups(self):
    """Runs of identical layers ``((kind, start, end), ...)``, each scanned as one stack."""
    groups, kinds = [], self.layer_kinds
    for i, kind in enumerate(kinds):
      if groups and groups[-1][0] == kind:
        groups[-1] = (kind, groups[-1][1], i + 1)
      else:
        groups.append((kind, i, i + 1))
    return tuple(groups)

  @property
  def num_softmax_layers(self):
    return self.layer_kinds.count("softmax")

  @property
  def num_hybrid_layers(self):
    return self.layer_kinds.count("hybrid")

  @property
  def head_dim(self):
    return self.dim // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @classmethod
  def from_dict(cls, d):
    """From a mapping (e.g. an ml-collections ``ConfigDict``); unknown keys are an error."""
    d = _checked_fields(cls, d, "model")
    if "patch_size" in d:
      d["patch_size"] = tuple(d["patch_size"])
    if "camera" in d and not isinstance(d["camera"], CameraConfig):
      d["camera"] = CameraConfig.from_dict(d["camera"])
    if "loci" in d and not isinstance(d["loci"], LociConfig):
      d["loci"] = LociConfig.from_dict(d["loci"])
    if "attention" in d and not isinstance(d["attention"], AttentionConfig):
      d["attention"] = AttentionConfig.from_dict(d["attention"])
    return cls(**d)


def default_config_dict(cls=ModelConfig):
  """The defaults of dataclass ``cls`` as a nested dict (sub-configs as dicts): for ``ModelConfig``,
  the ``model`` block that config files start from and override (defaults live only here)."""
  out = {}
  for f in dataclasses.fields(cls):
    v = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    out[f.name] = default_config_dict(type(v)) if dataclasses.is_dataclass(v) else v
  return out
