"""The encoders by name, in one place: video autoencoders (what ingestion encodes with, what a checkpoint's
latents mean, what sampling decodes with, chunk by chunk), text encoders (``data.text_encoder``), and the two
protocols ingestion takes (:class:`LatentEncoder`, :class:`CaptionEncoder`: built-ins or plug-ins).

Video autoencoders (``data.vae``, ``python -m jaxwm.data.ingest --vae``):

- ``space_to_depth:S``: the lossless stand-in of the procedural scenes (``jaxwm.models.vae``); no
  temporal compression, ``3 S^2`` channels.
- ``wan2.2:<weights>`` / ``wan2.1:<weights>``: the Wan VAEs (``jaxwm.models.wan_vae``) with weights from
  diffusers ``AutoencoderKLWan`` safetensors or the original ``Wan2.x_VAE.pth``; 4x temporal compression,
  latents normalised per channel (``(z - mean) / std``). A diffusers ``vae/`` folder's ``config.json`` gives
  the structure (any size; checked against the name's version); a file is the released size.
- ``wan2.2-tiny:<seed>`` / ``wan2.1-tiny:<seed>``: the same structures at test size with random weights from
  ``seed`` (tests and the CPU end-to-end run; nothing to download).

Text encoders (``data.text_encoder``, ``--text_encoder``; :mod:`jaxwm.text`): ``umt5:<tokenizer>,<weights>``
(umT5-XXL, Wan's; a transformers ``text_encoder/`` folder's ``config.json`` gives another size) and
``umt5-tiny:<seed>`` (random test-size weights).
"""

import dataclasses
import functools
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

NAME_FORMS = ("space_to_depth:S", "wan2.2:<weights>", "wan2.1:<weights>", "wan2.2-tiny:<seed>", "wan2.1-tiny:<seed>")


@dataclasses.dataclass(frozen=True)
class Autoencoder:
  """A video autoencoder.

  Attributes:
    name: its name (module doc).
    spatial_stride, temporal_stride: pixels per latent pixel; frames per latent frame after the first.
    channels: latent channels.
    encode: uint8 or ``[-1, 1]`` float ``[B, F, H, W, 3]`` (``F = 1 + k * temporal_stride``) -> normalised
      latents ``[B, 1 + k, H/s, W/s, C]`` float32.
    decoder: ``batch, h, w -> StreamDecoder``.
  """
  name: str
  spatial_stride: int
  temporal_stride: int
  channels: int
  encode: Callable
  decoder: Callable


class StreamDecoder:
  """Decodes a latent video chunk by chunk in constant memory: ``step(latents [B, n, h, w, C]) -> uint8
  [B, frames, H, W, 3]`` (the first chunk's first latent frame gives one frame, every other one
  ``temporal_stride``); the concatenated chunks equal decoding the whole clip."""

  def __init__(self, init_state, step_fn):
    self._state, self._step_fn = init_state, step_fn

  def step(self, latents):
    self._state, video = _decode_uint8(self._step_fn, self._state, jnp.asarray(latents, jnp.float32))
    return np.asarray(video)


@functools.partial(jax.jit, static_argnums=0)
def _decode_uint8(step_fn, state, latents):
  """One program per chunk: the decoder's step and the conversion to uint8 (eagerly, their small ops each
  cost a dispatch)."""
  state, video = step_fn(state, latents)
  return state, to_uint8(video)


def to_uint8(video):
  """``[-1, 1]`` float -> uint8."""
  return jnp.clip(jnp.round((video + 1.0) * 127.5), 0, 255).astype(jnp.uint8)


def _to_float(frames):
  frames = jnp.asarray(frames)
  return frames.astype(jnp.float32) / 127.5 - 1.0 if frames.dtype == jnp.uint8 else frames.astype(jnp.float32)


def _space_to_depth(stride):
  from jaxwm.models import vae  # pylint: disable=g-import-not-at-top

  def decoder(batch, h, w):
    del batch, h, w
    return StreamDecoder(None, _space_to_depth_step(stride))

  return Autoencoder(f"space_to_depth:{stride}", stride, 1, 3 * stride**2,
                     lambda x: vae.encode(_to_float(x), stride), decoder)


@functools.lru_cache(maxsize=None)
def _space_to_depth_step(stride):
  """The stateless decoder step of ``space_to_depth:stride`` (one function per stride: compiled once)."""
  from jaxwm.models import vae  # pylint: disable=g-import-not-at-top
  return lambda state, z: (state, vae.decode(z, stride))


def _folder_config(source):
  """The ``config.json`` dict of a weights folder (a diffusers ``vae/`` or transformers ``text_encoder/``
  folder), or None for a file or a folder without one."""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(source).expanduser() / "config.json"
  if not path.is_file():
    return None
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: not a readable JSON config ({e})") from None


def _folder_vae_config(kind, source):
  """A diffusers ``vae/`` folder's own structure (any size), checked against the name's version: Wan2.2's VAE
  patchifies (``patch_size`` 2, 16x spatial), Wan2.1's does not."""
  from jaxwm.models.wan_vae import WanVAEConfig  # pylint: disable=g-import-not-at-top
  d = _folder_config(source)
  if d is None:
    return None
  try:
    cfg = WanVAEConfig.from_diffusers(d)
  except (TypeError, ValueError) as e:
    raise ValueError(f"vae={kind}:{source}: config.json does not describe a Wan VAE ({' '.join(str(e).split())})") \
        from None
  v22 = (cfg.patch_size or 1) > 1
  if v22 != (kind == "wan2.2"):
    other = "wan2.2" if v22 else "wan2.1"
    raise ValueError(f"vae={kind}:{source}: its config.json describes a {other} VAE (patch_size={cfg.patch_size}); "
                     f"name it {other}:{source}")
  return cfg


def _random_init(module, seed, sample):
  """``module.init`` compiled without XLA's backend optimisations: the VAE's 148 truncated-normal draws take
  about 32 s to compile optimised on CPU and 3 s without (ingestion, sampling and tests each start one). The
  weights are random test weights, the same on every call and process of this jax version."""
  key = jax.random.key(seed)
  init = jax.jit(module.init).lower(key, sample).compile({"xla_backend_optimization_level": 0})
  return init(key, sample)


@functools.lru_cache(maxsize=4)
def _wan(kind, source):
  from jaxwm.models.wan_vae import WanVAE, WanVAEConfig  # pylint: disable=g-import-not-at-top
  tiny = kind.endswith("-tiny")
  v21 = kind.startswith("wan2.1")
  if tiny:
    cfg = WanVAEConfig.tiny_wan21() if v21 else WanVAEConfig.tiny_wan22()
  else:
    cfg = _folder_vae_config(kind, source) or (WanVAEConfig.wan21() if v21 else WanVAEConfig.wan22())
  vae = WanVAE(cfg)
  s = cfg.scale_factor_spatial
  if tiny:
    params = _random_init(vae, int(source), jnp.zeros((1, 1, s, s, 3)))
  else:
    import pathlib  # pylint: disable=g-import-not-at-top
    from jaxwm.convert.wan_vae import load_wan_vae_safetensors  # pylint: disable=g-import-not-at-top
    path = pathlib.Path(source).expanduser()
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]  # a diffusers vae/ folder, or one file
    if not files or not all(f.is_file() for f in files):
      raise ValueError(f"vae weights {source!r}: no such file (a .safetensors or .pth file, or a folder of "
                       ".safetensors)")
    params = load_wan_vae_safetensors(files, cfg)

  @jax.jit
  def encode(x):
    mean, _ = vae.apply(params, _to_float(x), method=WanVAE.encode)
    return vae.normalize(mean)

  step = jax.jit(lambda state, z: vae.apply(params, state, vae.denormalize(z), method=WanVAE.decode_step))

  def decoder(batch, h, w):
    return StreamDecoder(vae.decode_init(batch, h, w), step)

  return Autoencoder(f"{kind}:{source}", s, cfg.scale_factor_temporal, cfg.z_dim, encode, decoder)


def make_autoencoder(name):
  """The :class:`Autoencoder` called ``name`` (module doc); a one-line ValueError names the allowed forms."""
  m = re.fullmatch(r"space_to_depth(?::(\d+))?", str(name))
  if m:
    return _space_to_depth(int(m.group(1) or 4))
  m = re.fullmatch(r"(wan2\.[12](?:-tiny)?):(.+)", str(name))
  if m:
    kind, source = m.groups()
    if kind.endswith("-tiny") and not source.isdigit():
      raise ValueError(f"vae={name!r}: {kind} takes an integer seed, e.g. {kind}:0")
    return _wan(kind, source)
  raise ValueError(f"vae={name!r}: must be one of {', '.join(NAME_FORMS)}")


def autoencoder_strides(name):
  """``(spatial_stride, temporal_stride)`` of a built-in autoencoder name without building it or reading weights
  (so a command can refuse a frame size first); None for a name that is not built-in (a plug-in)."""
  geometry = autoencoder_geometry(name)
  return None if geometry is None else geometry[:2]


def autoencoder_geometry(name):
  """``(spatial_stride, temporal_stride, latent channels)`` of a built-in autoencoder name, without building it
  or reading weights (a folder's ``config.json`` is read); None for a plug-in."""
  m = re.fullmatch(r"space_to_depth(?::(\d+))?", str(name))
  if m:
    if int(m.group(1) or 4) < 1:
      raise ValueError(f"vae={name!r}: the stride S of space_to_depth:S must be >= 1")
    return int(m.group(1) or 4), 1, 3 * int(m.group(1) or 4)**2
  m = re.fullmatch(r"(wan2\.[12])(-tiny)?:.+", str(name))
  if m:
    from jaxwm.models.wan_vae import WanVAEConfig  # pylint: disable=g-import-not-at-top
    v21, tiny = m.group(1) == "wan2.1", bool(m.group(2))
    cfg = None if tiny else _folder_vae_config(m.group(1), str(name).split(":", 1)[1])
    cfg = cfg or ((WanVAEConfig.tiny_wan21() if tiny else WanVAEConfig.wan21()) if v21 else (
        WanVAEConfig.tiny_wan22() if tiny else WanVAEConfig.wan22()))
    return cfg.scale_factor_spatial, cfg.scale_factor_temporal, cfg.z_dim
  return None


@dataclasses.dataclass(frozen=True)
class LatentEncoder:
  """A video VAE for ingestion.

  Attributes:
    name: recorded in the manifest and each record.
    fn: uint8 ``[N, F, H, W, 3]`` -> ``[N, F', h, w, C]`` with ``F' = 1 + (F - 1) // temporal_stride``.
    temporal_stride: 1 (per-frame) or a causal VAE's stride (Wan: 4; ``F`` must be ``1 + 4 k``).
    spatial_stride: ``H, W`` must be multiples of it (``h = H / spatial_stride``).
  """
  name: str
  fn: Callable
  temporal_stride: int = 1
  spatial_stride: int = 1


@dataclasses.dataclass(frozen=True)
class CaptionEncoder:
  """A text encoder for ingestion: ``fn``, ``list[str]`` (N captions) -> ``[N, L, D]`` embeddings (padded to one
  ``L``)."""
  name: str
  fn: Callable


def latent_encoder(name):
  """The :class:`LatentEncoder` of :func:`make_autoencoder`'s ``name``."""
  ae = make_autoencoder(name)
  return LatentEncoder(ae.name, lambda frames: np.asarray(ae.encode(frames)), ae.temporal_stride, ae.spatial_stride)


def space_to_depth_encoder(stride=4):
  """The lossless stand-in VAE (``jaxwm.models.vae.encode``): ``[N, F, H, W, 3] -> [N, F, H/s, W/s, 3 s^2]``."""
  from jaxwm.models import vae  # pylint: disable=g-import-not-at-top
  return LatentEncoder(f"space_to_depth:{stride}", lambda x: np.asarray(vae.encode(np.asarray(x), stride)), 1, stride)


def caption_encoder(name):
  """The :class:`CaptionEncoder` of :func:`make_text_encoder`'s ``name``."""
  enc = make_text_encoder(name)
  return CaptionEncoder(name, lambda captions: enc.encode(list(captions))[0])


TEXT_ENCODER_FORMS = ("umt5:<tokenizer>,<weights>", "umt5-tiny:<seed>")


@functools.lru_cache(maxsize=2)
def make_text_encoder(name, max_length=512):
  """A :class:`jaxwm.text.TextEncoder` by name: ``umt5:<tokenizer path>,<weights path>`` (umT5-XXL, Wan's text
  encoder; local files only) or ``umt5-tiny:<seed>`` (random test-size weights, tiny tokenizer, 32 tokens)."""
  from jaxwm.text import TextEncoder, random_text_encoder  # pylint: disable=g-import-not-at-top
  m = re.fullmatch(r"umt5-tiny:(\d+)", str(name))
  if m:
    return random_text_encoder(seed=int(m.group(1)))
  m = re.fullmatch(r"umt5:([^,]+),(.+)", str(name))
  if m:  # a transformers text_encoder/ folder brings its own size in config.json; files are umT5-XXL
    from jaxwm.models.umt5 import UMT5Config  # pylint: disable=g-import-not-at-top
    d = _folder_config(m.group(2))
    cfg = None if d is None else UMT5Config.from_hf(d)
    return TextEncoder.load(m.group(1), m.group(2), cfg=cfg, max_length=max_length)
  raise ValueError(f"text_encoder={name!r}: must be one of {', '.join(TEXT_ENCODER_FORMS)}")
