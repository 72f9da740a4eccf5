"""LoRA adapters on disk: each its own small checkpoint (:class:`jaxwm.checkpoint.Checkpointer`: atomic, with
checksums) holding the factors, the :class:`jaxwm.lora.LoraSpec`, the targets with their base shapes and a
fingerprint of the base's parameter shapes, checked against the base an adapter is loaded for."""

import hashlib
import pathlib
import sys
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jaxwm import checkpoint as ckpt_lib
from jaxwm.lora import (ADAPTER_FIELD, AdapterMismatchError, LoraSpec, check_fits, nest, factor_specs, factors,
                        flat_paths, lora_param_count)

FORMAT_VERSION = 1


def param_fingerprint(params):
  """sha256 of the sorted ``path shape dtype`` lines of ``params`` (arrays or shape structs)."""
  lines = [f"{p} {tuple(x.shape)} {jnp.dtype(x.dtype).name}" for p, x in sorted(flat_paths(params).items())]
  return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _say(msg):
  if jax.process_index() == 0:
    print(msg, file=sys.stderr, flush=True)


def _resolve(path):
  """``(checkpoints directory, step or None)``: ``path`` is an adapter directory or one step's directory."""
  p = pathlib.Path(path)
  if p.name.isdigit() and (p / "state").is_dir():
    return p.parent, int(p.name)
  return p, None


def save_adapter(directory, adapter, spec, base_params, step=0, keep=None, extra=None):
  """Saves ``adapter`` as its own checkpoint ``<directory>/<step>/`` (:class:`jaxwm.checkpoint.Checkpointer`:
  written to a temporary directory renamed on completion, with checksums; synchronous).

  The step's ``state`` holds ``{"lora": adapter}``; its JSON ``config`` item holds the spec, the targets
  with their base shapes, ``lora_param_count``, :func:`param_fingerprint` of ``base_params`` and ``extra``
  (JSON-serialisable, e.g. the few-step sampling settings of a distilled adapter).

  Returns:
    The step directory.
  """
  pairs = factors(adapter)
  flat = flat_paths(base_params)
  check_fits(flat, pairs, spec.rank, "save_adapter")
  meta = {"format": "jaxwm.lora", "version": FORMAT_VERSION, "spec": spec.to_dict(),
          "targets": {p: list(flat[p].shape) for p in sorted(pairs)}, "param_count": lora_param_count(adapter),
          "base_fingerprint": param_fingerprint(base_params), "extra": dict(extra or {})}
  ckpt = ckpt_lib.Checkpointer(directory, keep=keep, async_save=False)
  try:
    ckpt.save(step, {ADAPTER_FIELD: adapter}, config=meta)
  finally:
    ckpt.close()
  return ckpt.directory / str(int(step))


def _default_shardings(leaf):
  """``(a, b)`` shardings for the factors of a base leaf: :func:`factor_specs` of its ``NamedSharding``, else
  the first device."""
  sh = getattr(leaf, "sharding", None)
  if isinstance(sh, NamedSharding):
    return tuple(NamedSharding(sh.mesh, s) for s in factor_specs(sh.spec, len(leaf.shape)))
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return one, one


def load_adapter(path, base_params, step=None, sharding=None, say=_say):
  """Restores an adapter saved by :func:`save_adapter` for ``base_params`` (arrays or shape structs).

  Args:
    path: the adapter directory (its newest intact step) or one step's directory.
    base_params: the base the adapter will be applied to: every target must be a parameter of it with
      the shape the factors fit; other parameters may differ (a note is printed when the base's
      fingerprint is not the one saved).
    step: the step (default: ``path``'s, or the newest intact one).
    sharding: a ``jax.sharding.Sharding`` for every factor (default: each factor sharded like its base
      kernel, :func:`factor_specs`, or the first device when the base is not on a mesh).
    say: where the fingerprint note goes.

  Returns:
    ``(adapter, spec)``. Raises :class:`AdapterMismatchError` (one line) when the adapter does not fit
    ``base_params``, ``FileNotFoundError`` when there is no adapter at ``path``.
  """
  directory, found = _resolve(path)
  if not directory.is_dir():
    raise FileNotFoundError(f"no LoRA adapter at {path}")
  step = found if step is None else step
  flat = flat_paths(base_params)
  ckpt = ckpt_lib.Checkpointer(directory, keep=None, async_save=False)

  def attempt(s):
    where = f"adapter {directory / str(s)}"
    meta = ckpt.restore_config(s)
    if not isinstance(meta, Mapping) or meta.get("format") != "jaxwm.lora":
      raise AdapterMismatchError(f"{where} is not a LoRA adapter checkpoint (no 'jaxwm.lora' config)")
    spec = LoraSpec.from_dict(meta["spec"])
    saved = factors(ckpt.state_metadata(s)[ADAPTER_FIELD])
    check_fits(flat, saved, spec.rank, where)
    if meta.get("base_fingerprint") != param_fingerprint(base_params):
      say(f"note: {where} was saved for a base with other parameter shapes; its {len(saved)} targets fit this one")
    target = {}
    for p, (a, b) in saved.items():
      sh_a, sh_b = (sharding, sharding) if sharding is not None else _default_shardings(flat[p])
      target[p] = {"a": jax.ShapeDtypeStruct(tuple(a.shape), a.dtype, sharding=sh_a),
                   "b": jax.ShapeDtypeStruct(tuple(b.shape), b.dtype, sharding=sh_b)}
    return ckpt.restore_fields({ADAPTER_FIELD: nest(target)}, s)[ADAPTER_FIELD], spec

  try:
    return ckpt.restore_with(attempt, step, user_errors=(AdapterMismatchError,))[0]
  finally:
    ckpt.close()


def adapter_metadata(path, step=None):
  """The JSON saved with an adapter (``spec``, ``targets``, ``param_count``, ``base_fingerprint``, ``extra``)."""
  directory, found = _resolve(path)
  if not directory.is_dir():
    raise FileNotFoundError(f"no LoRA adapter at {path}")
  ckpt = ckpt_lib.Checkpointer(directory, keep=None, async_save=False)
  try:
    return ckpt.restore_with(ckpt.restore_config, found if step is None else step)[0]
  finally:
    ckpt.close()
