"""Checks of a training config before anything is created, loaded or compiled (``train.py``).

:func:`validate` checks every value of ``seed``, ``optim``, ``train``, ``data``, ``recipe``,
``sample``, ``mesh`` and ``sharding_rules``, builds the model block
(:meth:`jaxwm.models.config.ModelConfig.from_dict`, whose own checks name the key) and, given the
number of devices, the mesh and the global batch. A refusal is a :class:`ConfigError` whose text is
one line, ``<key>=<value>: <what is allowed>``.

Command-line lists: ``--config.model.camera.channels='[[0,7]]'`` reaches a string-typed field as a
string; :func:`parse_list_strings` reads such strings (for :data:`LIST_KEYS`) with
``ast.literal_eval`` first, so the range checks of the model are reachable from the command line.

The global batch (:func:`resolve_batch_size`): ``data.batch_size`` when it is > 0 (it must divide
over the devices the ``batch`` sharding rule spreads it on, ``data x fsdp`` by default), else
``data.per_device_batch_size`` times those devices (``configs/tiny.py``: 4 per device, so the
default runs on 1, 2, 4 or 8 devices).
"""

import ast
import math
import os
import pathlib

from jaxwm.utils.cli import MAX_SEED

LIST_KEYS = ("model.camera.channels", "model.camera.depth_range", "model.patch_size", "model.loci.blocks")
MESH_AXES = ("data", "fsdp")  # jaxwm.training.sharding.MESH_AXES (not imported: that module imports flax)


class ConfigError(ValueError):
  """A refused config value: ``str(e)`` is ``<key>=<value>: <allowed>``, one line."""

  def __init__(self, key, value, allowed):
    self.key, self.value, self.allowed = key, value, allowed
    super().__init__(f"{key}={show(value)}: {allowed}")


def show(value):
  """A value as the user would type it (strings quoted, tuples as lists)."""
  if isinstance(value, str):
    return repr(value)
  if isinstance(value, (list, tuple)):
    return "[" + ",".join(show(v) for v in value) + "]"
  return str(value)


def _get(config, key):
  node = config
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node:
      raise ConfigError(key, "<missing>", "the config has no such key (start from configs/tiny.py)")
    node = node[part]
  return node


def _has(config, key):
  try:
    _get(config, key)
    return True
  except ConfigError:
    return False


def _set(config, key, value):
  """Sets ``key`` even when ``value``'s type differs from the field's (a string field given a list)."""
  *path, last = key.split(".")
  node = config
  for p in path:
    node = node[p]
  try:
    node[last] = value
  except TypeError:  # ml-collections keeps a field's type; replace the field
    unlocked = node.unlocked() if hasattr(node, "unlocked") else None
    if unlocked is None:
      raise
    with unlocked:
      del node[last]
      node[last] = value


def parse_list_strings(config):
  """Strings that look like lists or tuples at :data:`LIST_KEYS` -> Python values (``ast.literal_eval``).

  Returns the keys changed. A string that does not parse is a :class:`ConfigError`.
  """
  changed = []
  for key in LIST_KEYS:
    if not _has(config, key):
      continue
    v = _get(config, key)
    if isinstance(v, str) and v.strip()[:1] in ("[", "("):
      try:
        parsed = ast.literal_eval(v.strip())
      except (ValueError, SyntaxError):
        raise ConfigError(key, v, "not a Python/JSON list, e.g. '[[32,44]]' or '(1,2,2)'") from None
      if not isinstance(parsed, (list, tuple)):
        raise ConfigError(key, v, "not a list")
      _set(config, key, _tuples(parsed))
      changed.append(key)
  return changed


def _tuples(x):
  return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------------------------------------------------------
# Value checks. Each takes the dotted key and raises ConfigError.


def _int(config, key, lo=None, hi=None, allowed=None):
  v = _get(config, key)
  if isinstance(v, bool) or not isinstance(v, int):
    raise ConfigError(key, v, allowed or "must be an integer")
  if (lo is not None and v < lo) or (hi is not None and v > hi):
    raise ConfigError(key, v, allowed or _range_text(lo, hi, "integer"))
  return v


def _range_text(lo, hi, kind="number"):
  if lo is not None and hi is not None:
    return f"must be an {kind} in [{lo}, {hi}]" if kind == "integer" else f"must lie in [{lo}, {hi}]"
  if lo is not None:
    return f"must be an {kind} >= {lo}" if kind == "integer" else f"must be >= {lo}"
  return f"must be an {kind} <= {hi}" if kind == "integer" else f"must be <= {hi}"


def _float(config, key, *, gt=None, ge=None, lt=None, le=None, allowed=None):
  v = _get(config, key)
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise ConfigError(key, v, allowed or "must be a finite number")
  bad = ((gt is not None and not v > gt) or (ge is not None and not v >= ge) or (lt is not None and not v < lt) or
         (le is not None and not v <= le))
  if bad:
    if allowed is None:
      parts = [f"> {gt}" if gt is not None else f">= {ge}" if ge is not None else None,
               f"< {lt}" if lt is not None else f"<= {le}" if le is not None else None]
      allowed = "must be " + " and ".join(p for p in parts if p)
    raise ConfigError(key, v, allowed)
  return v


def _bool(config, key):
  v = _get(config, key)
  if not isinstance(v, bool):
    raise ConfigError(key, v, "must be True or False")
  return v


def _choice(config, key, choices):
  v = _get(config, key)
  if v not in choices:
    raise ConfigError(key, v, f"must be one of {', '.join(map(repr, choices))}")
  return v


def _str(config, key, nonempty=False):
  v = _get(config, key)
  if not isinstance(v, str) or (nonempty and not v):
    raise ConfigError(key, v, "must be a non-empty string" if nonempty else "must be a string")
  return v


def _optional(config, key, check, *args, **kwargs):
  if _has(config, key):
    return check(config, key, *args, **kwargs)
  return None


def check_optim(config):
  _float(config, "optim.lr", gt=0, allowed="must be a finite learning rate > 0")
  _int(config, "optim.warmup_steps", lo=0)
  _float(config, "optim.end_lr_ratio", ge=0, allowed="must be >= 0 (the final learning rate is lr * end_lr_ratio)")
  _float(config, "optim.weight_decay", ge=0)
  _float(config, "optim.b1", ge=0, lt=1)
  _float(config, "optim.b2", ge=0, lt=1)
  _float(config, "optim.eps", gt=0)
  _float(config, "optim.grad_clip", ge=0, allowed="must be >= 0 (0: no clipping)")
  _float(config, "optim.ema_decay", ge=0, lt=1, allowed="must lie in [0, 1) (0: no EMA)")


def check_train(config):
  from jaxwm import tasks  # pylint: disable=g-import-not-at-top
  _optional(config, "train.task", _choice, tuple(tasks.TASKS))
  name = tasks.task_name(config)
  if name == "distill" and "distill" not in config:
    raise ConfigError("train.task", name, "needs a distill block (start from configs/distill.py)")
  if name != "distill" and "distill" in config:
    raise ConfigError("train.task", name, "the config has a distill block: set train.task=distill "
                      "(configs/distill.py does)")
  _int(config, "train.num_steps", lo=1)
  _int(config, "train.log_every", lo=1)
  _int(config, "train.ckpt_every", lo=1)
  _int(config, "train.keep", lo=1, allowed="must be an integer >= 1 (checkpoints kept; 0 would keep none)")
  _int(config, "train.sample_every", lo=0, allowed="must be an integer >= 0 (0: no periodic samples)")
  _optional(config, "train.gain_every", _int, lo=0, allowed="must be an integer >= 0 (0: no memory-gain probe)")
  _bool(config, "train.async_checkpoint")
  _str(config, "train.workdir", nonempty=True)
  _optional(config, "train.distributed", _bool)
  _optional(config, "train.init_from", _str)


def _check_records(config):
  """``data.source = "records"``: an ingested dataset whose latent frames hold the window and whose spatial
  stride is ``data.latent_stride``; returns its manifest."""
  import os  # pylint: disable=g-import-not-at-top
  from jaxwm.data.records import read_manifest  # pylint: disable=g-import-not-at-top
  path = _str(config, "data.data_dir", nonempty=True)
  manifest = read_manifest(os.path.expanduser(path))
  if manifest is None or not manifest.get("latent_shape"):
    raise ConfigError("data.data_dir", path, "must be a dataset written by python -m jaxwm.data.ingest "
                                             "(no manifest.json with finished clips there)")
  st = manifest["settings"]
  for key, field in (("data.vae", "vae"), ("data.text_encoder", "text_encoder")):
    v = _get(config, key) if _has(config, key) else None
    if v != st.get(field, "none"):
      raise ConfigError(key, v, f"must be {st.get(field, 'none')!r}, the encoder data.data_dir={path!r} was "
                                "ingested with (it is what sampling will decode and encode prompts with)")
  stride = _int(config, "data.latent_stride", lo=1)
  if int(st.get("spatial_stride", 1)) != stride:
    raise ConfigError("data.latent_stride", stride, f"must equal the dataset's VAE spatial stride "
                                                   f"{st.get('spatial_stride')} ({st.get('vae')})")
  return manifest


def check_data(config):
  from jaxwm.data.sources import SOURCES  # pylint: disable=g-import-not-at-top
  _choice(config, "data.source", SOURCES)
  if config.data.source == "records":
    manifest = _check_records(config)
    chunk = _int(config, "recipe.chunk_size", lo=1)
    frames = _int(config, "data.num_frames", lo=1)
    if frames < 1 + chunk or (frames - 1) % chunk:
      raise ConfigError("data.num_frames", frames, f"must be 1 + k * recipe.chunk_size={chunk} with k >= 1")
    fstride = _int(config, "data.frame_stride", lo=1)
    span = (frames - 1) * fstride + 1
    have = manifest["latent_shape"][0]
    if span > have:
      raise ConfigError("data.num_frames", frames, f"a window at data.frame_stride={fstride} spans {span} latent "
                                                  f"frames; the dataset's clips have {have}")
    _int(config, "data.batch_size", lo=0)
    _int(config, "data.worker_count", lo=0)
    for key in ("train.sample_every", "train.gain_every"):  # both stream the procedural eval loops
      if _has(config, key) and _get(config, key):
        raise ConfigError(key, _get(config, key), "must be 0 with data.source='records' (the periodic sample and "
                                                  "memory-gain probe render the procedural eval loops)")
    _optional(config, "data.palindrome_prob", _float, ge=0, le=1)
    _optional(config, "data.scale_divisor", _float, gt=0)
    return
  if config.data.source == "tfds":
    _str(config, "data.data_dir", nonempty=True)
  _int(config, "data.num_clips", lo=1)
  _int(config, "data.clips_per_scene", lo=1)
  _int(config, "data.clip_frames", lo=1)
  render = _int(config, "data.render_size", lo=1)
  size = _int(config, "data.image_size", lo=1)
  stride = _int(config, "data.latent_stride", lo=1)
  if render % size:
    divisors = [d for d in range(1, render + 1) if render % d == 0]
    raise ConfigError("data.image_size", size, f"must divide data.render_size={render} (frames are area-downsampled "
                                               f"by an integer factor): one of {divisors}")
  if size % stride:
    raise ConfigError("data.image_size", size, f"must be a multiple of data.latent_stride={stride}")
  if _has(config, "data.vae") and config.data.vae != f"space_to_depth:{config.data.get('latent_stride')}":
    raise ConfigError("data.vae", config.data.vae, f"must be 'space_to_depth:{config.data.get('latent_stride')}' "
                                                   "for rendered frames (other VAEs: ingest, data.source='records')")
  chunk = _int(config, "recipe.chunk_size", lo=1)
  frames = _int(config, "data.num_frames", lo=1)
  if frames < 1 + chunk or (frames - 1) % chunk:
    ok = ", ".join(str(1 + k * chunk) for k in range(1, 4))
    raise ConfigError("data.num_frames", frames, f"must be 1 + k * recipe.chunk_size={chunk} with k >= 1 ({ok}, ...)")
  fstride = _int(config, "data.frame_stride", lo=1)
  pal = _float(config, "data.palindrome_prob", ge=0, le=1) if _has(config, "data.palindrome_prob") else 0.0
  if pal > 0 and frames % 2 == 0:
    raise ConfigError("data.num_frames", frames, "must be odd when data.palindrome_prob > 0")
  path = frames if pal < 1 else (frames + 1) // 2
  span = (path - 1) * fstride + 1
  if span > config.data.clip_frames:
    raise ConfigError("data.clip_frames", config.data.clip_frames,
                      f"must be >= {span}, the frames a window of data.num_frames={frames} at "
                      f"data.frame_stride={fstride} spans")
  batch = _int(config, "data.batch_size", lo=0,
               allowed="must be an integer >= 0 (the global batch; 0: data.per_device_batch_size x devices)")
  per_device = _optional(config, "data.per_device_batch_size", _int, lo=0) or 0
  if batch == 0 and per_device == 0:
    raise ConfigError("data.batch_size", batch, "must be > 0 when data.per_device_batch_size is 0 (set one of them)")
  _int(config, "data.worker_count", lo=0)
  _optional(config, "data.scale_divisor", _float, gt=0)
  _optional(config, "data.convention", _choice, ("opencv", "opengl"))


def check_recipe(config):
  _int(config, "recipe.chunk_size", lo=1)
  _optional(config, "recipe.timestep_distribution", _choice, ("uniform", "logit_normal"))
  _optional(config, "recipe.timestep_shift", _float, gt=0)
  _optional(config, "recipe.layout", _choice, ("teacher_forcing", "diffusion_forcing"))
  if _has(config, "recipe.chunk_drop"):
    _bool(config, "recipe.chunk_drop.enabled")
    _int(config, "recipe.chunk_drop.keep", lo=0)
  if _has(config, "recipe.head_windows"):
    _bool(config, "recipe.head_windows.enabled")
    _int(config, "recipe.head_windows.window", lo=1)
    _float(config, "recipe.head_windows.global_fraction", gt=0, le=1)
    _int(config, "recipe.head_windows.pool", lo=1)


def check_sample(config):
  _int(config, "sample.num_steps", lo=1)
  _float(config, "sample.shift", gt=0)
  _optional(config, "sample.guidance", _float)


def check_mesh(config):
  for key in ("mesh.data", "mesh.fsdp"):
    v = _get(config, key)
    if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
      raise ConfigError(key, v, "must be an integer >= 1, or -1 for the remaining devices")
  if config.mesh.data == -1 and config.mesh.fsdp == -1:
    raise ConfigError("mesh.fsdp", -1, "at most one of mesh.data and mesh.fsdp may be -1")
  rules = _get(config, "sharding_rules")
  for i, rule in enumerate(rules):
    if not isinstance(rule, (list, tuple)) or len(rule) != 2 or not isinstance(rule[0], str):
      raise ConfigError(f"sharding_rules[{i}]", rule, "must be a pair [logical axis name, mesh axes]")
    axes = rule[1]
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    bad = [a for a in names if a not in MESH_AXES]
    if bad:
      raise ConfigError(f"sharding_rules[{i}]", rule, f"mesh axes must be None or among {MESH_AXES}")


def _check_attention_impl(cfg):
  """``model.attention_impl`` among ``jaxwm.kernels.ATTENTION_IMPLS``; a kernel (``splash``, ``cudnn``) only
  where self-attention uses it (an encoding with per-view keys attends in its own ``jnp`` code)."""
  from jaxwm.kernels import ATTENTION_IMPLS  # pylint: disable=g-import-not-at-top
  impl = cfg.attention_impl
  if impl not in ATTENTION_IMPLS:
    raise ConfigError("model.attention_impl", impl, f"must be one of {', '.join(map(repr, ATTENTION_IMPLS))}")
  if impl in ("splash", "cudnn") and cfg.encoding.per_view_keys:
    raise ConfigError("model.attention_impl", impl, f"must be 'xla' or 'auto' with model.camera.encoding="
                                                   f"{cfg.camera.encoding!r} (its per-view attention has no kernel)")


def check_model(config):
  """Builds :class:`ModelConfig` (its checks name the key) and the checks that tie it to ``data``.

  Returns the ``ModelConfig``. Raises ``ConfigError`` for the cross checks, ``ValueError`` from the model.
  """
  channels = config.model.camera.get("channels") if _has(config, "model.camera") else None
  if isinstance(channels, (list, tuple)):
    if not channels or not all(isinstance(r, (list, tuple)) and len(r) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) for x in r) for r in channels):
      raise ConfigError("model.camera.channels", channels,
                        "must be a placement name or a list of [start, end) integer ranges, e.g. [[32,44]]")
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  try:
    cfg = ModelConfig.from_dict(config.model)
  except TypeError as e:  # a value of the wrong type deep in the model
    raise ValueError(f"model: {e}") from None
  _check_attention_impl(cfg)
  d = config.data
  from jaxwm.data.sources import latent_geometry  # pylint: disable=g-import-not-at-top
  lat_h, lat_w, latent_channels = latent_geometry(d)
  where = "the ingested latents" if d.source == "records" else "3 * data.latent_stride**2: space-to-depth latents"
  for key in ("model.in_channels", "model.out_channels"):
    if _get(config, key) != latent_channels:
      raise ConfigError(key, _get(config, key), f"must equal {latent_channels} ({where})")
  for i, axis, grid in ((1, "height", lat_h), (2, "width", lat_w)):
    if grid % cfg.patch_size[i]:
      raise ConfigError("model.patch_size", cfg.patch_size,
                        f"its {axis} {cfg.patch_size[i]} must divide the {grid} latent pixels")
  if cfg.cross_attn and d.source == "records":
    from jaxwm.data.records import read_manifest  # pylint: disable=g-import-not-at-top
    import os  # pylint: disable=g-import-not-at-top
    if read_manifest(os.path.expanduser(d.data_dir))["settings"].get("text_encoder", "none") == "none":
      raise ConfigError("model.cross_attn", True, f"data.data_dir={d.data_dir!r} has no text embeddings "
                                                  "(ingest with --text_encoder)")
  _optional(config, "recipe.text_dropout", _float, ge=0, lt=1)
  if cfg.camera_conditioned and cfg.camera.vae_stride != d.latent_stride:
    raise ConfigError("model.camera.vae_stride", cfg.camera.vae_stride,
                      f"must equal data.latent_stride={d.latent_stride} (pixels per latent pixel)")
  return cfg


def check_init_from(config, workdir=None):
  """``train.init_from`` (an earlier stage's workdir, or the released Wan transformer's ``.safetensors`` file(s)
  or their directory) must exist unless the run resumes (``<workdir>/checkpoints`` exists)."""
  src = config.train.get("init_from", "")
  if not src:
    return
  resumes = workdir is not None and (pathlib.Path(workdir) / "checkpoints").is_dir()
  path = os.path.expanduser(src)
  if not resumes and not (os.path.isdir(path) or (os.path.isfile(path) and path.endswith(".safetensors"))):
    raise ConfigError("train.init_from", src, "no such directory or .safetensors file (an earlier stage's workdir, "
                                              "or the Wan transformer's weights)")


def batch_axes(config):
  """The mesh axes the ``batch`` logical axis is sharded over (by ``config.sharding_rules``)."""
  for name, axes in config.sharding_rules:
    if name == "batch":
      return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return ()


def mesh_shape(config, num_devices):
  """``{"data": d, "fsdp": f}`` with ``-1`` resolved against ``num_devices``; ``ConfigError`` if it cannot fit."""
  data, fsdp = config.mesh.data, config.mesh.fsdp
  divisors = [k for k in range(1, num_devices + 1) if num_devices % k == 0]
  for key, v in (("mesh.data", data), ("mesh.fsdp", fsdp)):
    if v != -1 and num_devices % v:
      raise ConfigError(key, v, f"must divide the {num_devices} devices: one of {divisors} (or -1)")
  data = num_devices // fsdp if data == -1 else data
  fsdp = num_devices // data if fsdp == -1 else fsdp
  if data * fsdp != num_devices:
    raise ConfigError("mesh.data", config.mesh.data,
                      f"mesh (data={data}, fsdp={fsdp}) needs {data * fsdp} devices; {num_devices} available "
                      "(set mesh.data=-1 to take the remaining devices)")
  return {"data": data, "fsdp": fsdp}


def resolve_batch_size(config, num_devices, num_processes=1):
  """The global batch for ``num_devices`` (over ``num_processes`` hosts): sets ``config.data.batch_size``
  when it is 0 (auto).

  Returns:
    a one-line note saying where the global batch comes from.

  Raises:
    ConfigError: a batch that does not divide over the devices the ``batch`` rule shards it on.
  """
  shape = mesh_shape(config, num_devices)
  axes = batch_axes(config)
  shards = math.prod(shape[a] for a in axes)
  where = " x ".join(f"{a}={shape[a]}" for a in axes) or "no mesh axis"
  per_device = config.data.get("per_device_batch_size", 0)
  if config.data.batch_size == 0:
    config.data.batch_size = per_device * shards
    return (f"global batch {config.data.batch_size} = data.per_device_batch_size {per_device} x {shards} "
            f"(the batch's mesh axes {where})")
  b = config.data.batch_size
  if b % shards:
    ok = ", ".join(str(shards * k) for k in range(1, 4))
    raise ConfigError("data.batch_size", b,
                      f"must be a multiple of {shards}, the batch's mesh axes ({where}) on {num_devices} devices: "
                      f"{ok}, ... (or 0: data.per_device_batch_size x {shards})")
  if b % num_processes:
    raise ConfigError("data.batch_size", b, f"must be a multiple of the {num_processes} processes (hosts)")
  return f"global batch {b} (data.batch_size; {b // shards} per batch shard over {where})"


def validate(config, *, num_devices=None, num_processes=1, workdir=None):
  """Every check above, in order; with ``num_devices`` also the mesh and the global batch (which it sets
  when ``data.batch_size`` is 0). Returns one-line notes (defaults used, strings parsed).

  Raises:
    ConfigError: a refused value (one line: key, value, what is allowed).
    ValueError: from the model's own checks (they name the key).
  """
  notes = [f"{k} parsed from the string to {show(_get(config, k))}" for k in parse_list_strings(config)]
  _int(config, "seed", lo=0, hi=MAX_SEED, allowed=f"must be an integer in [0, {MAX_SEED}] (larger seeds repeat "
                                                   "smaller ones' random keys)")
  check_optim(config)
  check_train(config)
  check_recipe(config)
  check_data(config)
  check_sample(config)
  check_mesh(config)
  check_model(config)
  check_init_from(config, workdir)
  if num_devices is not None:
    notes.append(resolve_batch_size(config, num_devices, num_processes))
  return notes
