"""Checks of a training config before anything is created, loaded or compiled (``train.py``).

:func:`validate` refuses unknown top-level keys, parses every block with its dataclass (:data:`BLOCKS`: each
checks its own fields, :mod:`jaxwm.settings`; the model block is :meth:`jaxwm.models.config.ModelConfig.from_dict`,
whose own checks name the key), then makes the checks that span blocks (data against recipe and train, the model
against data, ``sharding_rules`` against the mesh axes) and, given the number of devices, the mesh and the global
batch (:func:`jaxwm.training.sharding.resolve_batch_size`). A refusal is a :class:`ConfigError` whose text is
one line, ``<key>=<value>: <what is allowed>``.

Command-line lists: ``--config.model.camera.channels='[[0,7]]'`` reaches a string-typed field as a
string; :func:`parse_list_strings` reads such strings (for :data:`LIST_KEYS`) with
``ast.literal_eval`` first, so the range checks of the model are reachable from the command line.

"""

import ast
import contextlib
import os
import pathlib

from jaxwm.blocks import BLOCKS
from jaxwm.data.sources import latent_geometry
from jaxwm.settings import ConfigError, Int, Str, show
from jaxwm.training.sharding import MESH_AXES, resolve_batch_size
from jaxwm.utils.cli import MAX_SEED

LIST_KEYS = ("model.camera.channels", "model.camera.depth_range", "model.patch_size", "model.loci.blocks")


def top_level_keys():
  """The keys a config may have at the top: ``seed``, ``model``, ``sharding_rules``, :data:`BLOCKS` and the blocks
  tasks add (:data:`jaxwm.tasks.TASKS`)."""
  from jaxwm import tasks  # pylint: disable=g-import-not-at-top
  return ("seed", "model", "sharding_rules", *BLOCKS, *(t.block for t in tasks.TASKS.values() if t.block))


def _fill(node, values, prefix, notes):
  """Writes the keys of ``values`` (a parsed block's dict) that ``node`` lacks into it, one note each."""
  for k, v in values.items():
    if k not in node:
      with node.unlocked() if hasattr(node, "unlocked") else contextlib.nullcontext():
        node[k] = v
      notes.append(f"{prefix}.{k} not set: {show(v)} (the default)")
    elif isinstance(v, dict):
      _fill(node[k], v, f"{prefix}.{k}", notes)


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


def check_blocks(config, notes=None):
  """Unknown top-level keys refused (with suggestions); every block of :data:`BLOCKS` parsed, its fields checked,
  and the keys it lacks written into ``config`` with their defaults (one note each in ``notes``), so that what is
  checked is what runs. Returns ``{prefix: block}``."""
  import difflib  # pylint: disable=g-import-not-at-top
  top = top_level_keys()
  for k in config.keys():
    if k not in top:
      close = difflib.get_close_matches(k, top, n=2, cutoff=0.6)
      raise ConfigError(k, config[k], ("did you mean " + " or ".join(map(repr, close)) + "? " if close else "") +
                        f"top-level keys: {', '.join(top)}")
  blocks = {prefix: cls.from_dict(_get(config, prefix)) for prefix, cls in BLOCKS.items()}
  for prefix, block in blocks.items():
    _fill(config[prefix], block.to_dict(), prefix, [] if notes is None else notes)
  return blocks


def check_train(config):
  """``train.task`` against the config's blocks."""
  from jaxwm import tasks  # pylint: disable=g-import-not-at-top
  name = tasks.task_name(config)
  if name == "distill" and "distill" not in config:
    raise ConfigError("train.task", name, "needs a distill block (start from configs/distill.py)")
  if name != "distill" and "distill" in config:
    raise ConfigError("train.task", name, "the config has a distill block: set train.task=distill "
                      "(configs/distill.py does)")


def _check_records(d):
  """``data.source = "records"``: an ingested dataset whose latent frames hold the window and whose spatial
  stride is ``data.latent_stride``; returns its manifest."""
  from jaxwm.data.records import read_manifest  # pylint: disable=g-import-not-at-top
  path = Str(nonempty=True)("data.data_dir", d.data_dir)
  manifest = read_manifest(os.path.expanduser(path))
  if manifest is None or not manifest.get("latent_shape"):
    raise ConfigError("data.data_dir", path, "must be a dataset written by python -m jaxwm.data.ingest "
                                             "(no manifest.json with finished clips there; to compile "
                                             "before ingesting: train.py --compile_only ... --frame_size HxW)")
  st = manifest["settings"]
  for key, v, field in (("data.vae", d.vae, "vae"), ("data.text_encoder", d.text_encoder, "text_encoder")):
    if v != st.get(field, "none"):
      raise ConfigError(key, v, f"must be {st.get(field, 'none')!r}, the encoder data.data_dir={path!r} was "
                                "ingested with (it is what sampling will decode and encode prompts with)")
  if int(st.get("spatial_stride", 1)) != d.latent_stride:
    raise ConfigError("data.latent_stride", d.latent_stride, f"must equal the dataset's VAE spatial stride "
                                                             f"{st.get('spatial_stride')} ({st.get('vae')})")
  return manifest


def check_data(d, recipe, train):
  """The data block against the recipe (windows of ``1 + k * chunk_size`` frames), the train block (probes and
  samples render the procedural eval loops) and the source (an ingested dataset's manifest, rendered sizes)."""
  chunk, frames, fstride = recipe.chunk_size, d.num_frames, d.frame_stride
  if d.source == "records":
    manifest = _check_records(d)
    if frames < 1 + chunk or (frames - 1) % chunk:
      raise ConfigError("data.num_frames", frames, f"must be 1 + k * recipe.chunk_size={chunk} with k >= 1")
    span = (frames - 1) * fstride + 1
    have = manifest["latent_shape"][0]
    if span > have:
      raise ConfigError("data.num_frames", frames, f"a window at data.frame_stride={fstride} spans {span} latent "
                                                  f"frames; the dataset's clips have {have}")
    for key in ("sample_every", "gain_every"):  # both stream the procedural eval loops
      if getattr(train, key):
        raise ConfigError(f"train.{key}", getattr(train, key), "must be 0 with data.source='records' (the periodic "
                                                               "sample and memory-gain probe render the procedural "
                                                               "eval loops)")
    return
  if d.source == "tfds":
    Str(nonempty=True)("data.data_dir", d.data_dir)
  render, size, stride = d.render_size, d.image_size, d.latent_stride
  if render % size:
    divisors = [k for k in range(1, render + 1) if render % k == 0]
    raise ConfigError("data.image_size", size, f"must divide data.render_size={render} (frames are area-downsampled "
                                               f"by an integer factor): one of {divisors}")
  if size % stride:
    raise ConfigError("data.image_size", size, f"must be a multiple of data.latent_stride={stride}")
  if d.vae != f"space_to_depth:{stride}":
    raise ConfigError("data.vae", d.vae, f"must be 'space_to_depth:{stride}' for rendered frames (other VAEs: "
                                         "ingest, data.source='records')")
  if frames < 1 + chunk or (frames - 1) % chunk:
    ok = ", ".join(str(1 + k * chunk) for k in range(1, 4))
    raise ConfigError("data.num_frames", frames, f"must be 1 + k * recipe.chunk_size={chunk} with k >= 1 ({ok}, ...)")
  if d.palindrome_prob > 0 and frames % 2 == 0:
    raise ConfigError("data.num_frames", frames, "must be odd when data.palindrome_prob > 0")
  path = frames if d.palindrome_prob < 1 else (frames + 1) // 2
  span = (path - 1) * fstride + 1
  if span > d.clip_frames:
    raise ConfigError("data.clip_frames", d.clip_frames,
                      f"must be >= {span}, the frames a window of data.num_frames={frames} at "
                      f"data.frame_stride={fstride} spans")
  if d.batch_size == 0 and d.per_device_batch_size == 0:
    raise ConfigError("data.batch_size", 0, "must be > 0 when data.per_device_batch_size is 0 (set one of them)")


def check_sharding_rules(config):
  """``sharding_rules``: pairs ``[logical axis, mesh axes]`` over :data:`jaxwm.training.sharding.MESH_AXES`."""
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
  """``model.attention_impl`` among ``jaxwm.kernels.ATTENTION_IMPLS``; with per-view keys (WorldRoPE) only the impls
  of ``jaxwm.kernels.per_view_attention`` (``splash`` and ``cudnn`` have no per-view form)."""
  from jaxwm.kernels import ATTENTION_IMPLS  # pylint: disable=g-import-not-at-top
  impl = cfg.attention_impl
  if impl not in ATTENTION_IMPLS:
    raise ConfigError("model.attention_impl", impl, f"must be one of {', '.join(map(repr, ATTENTION_IMPLS))}")
  if impl in ("splash", "cudnn") and cfg.encoding.per_view_keys:
    raise ConfigError("model.attention_impl", impl, "must be 'xla', 'xla_lse', 'cpu_flash' or 'auto' with "
                                                   f"model.camera.encoding={cfg.camera.encoding!r} (its per-view "
                                                   "attention has no splash or cuDNN form)")


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
    if read_manifest(os.path.expanduser(d.data_dir))["settings"].get("text_encoder", "none") == "none":
      raise ConfigError("model.cross_attn", True, f"data.data_dir={d.data_dir!r} has no text embeddings "
                                                  "(ingest with --text_encoder)")
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
  if resumes or (pathlib.Path(path) / "checkpoints").is_dir():  # an earlier stage's workdir
    return
  from jaxwm.convert.wan import check_backbone, folder_transformer_config  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  try:  # the released weights' config.json, where there is one, against model.*
    found = folder_transformer_config(path)
    if found is not None:
      check_backbone(ModelConfig.from_dict(config.model), found[0], "its config.json")
  except ValueError as e:
    raise ConfigError("train.init_from", src, " ".join(str(e).split())) from None


def validate(config, *, num_devices=None, num_processes=1, workdir=None):
  """Every check above, in order; with ``num_devices`` also the mesh and the global batch (which it sets
  when ``data.batch_size`` is 0). Returns one-line notes (defaults used, strings parsed).

  Raises:
    ConfigError: a refused value (one line: key, value, what is allowed).
    ValueError: from the model's own checks (they name the key).
  """
  notes = [f"{k} parsed from the string to {show(_get(config, k))}" for k in parse_list_strings(config)]
  blocks = check_blocks(config, notes)
  Int(0, MAX_SEED, f"must be an integer in [0, {MAX_SEED}] (larger seeds repeat smaller ones' random keys)")(
      "seed", _get(config, "seed"))
  check_train(config)
  check_data(blocks["data"], blocks["recipe"], blocks["train"])
  check_sharding_rules(config)
  check_model(config)
  check_init_from(config, workdir)
  if num_devices is not None:
    notes.append(resolve_batch_size(config, num_devices, num_processes))
  return notes
