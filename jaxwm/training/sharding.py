"""Device mesh and logical-axis sharding rules (docs/design.md §11).

Parameters and activations carry logical axis names (``embed``, ``heads``, ``mlp``,
``layers``, ``batch``, ...). A rule table from the config maps them to mesh axes; the
default is FSDP: parameters sharded on ``embed`` over ``fsdp``, the batch over
``(data, fsdp)``.
"""

import dataclasses
import logging
import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxwm.settings import Block, ConfigError, setting

MESH_AXES = ("data", "fsdp")


def _mesh_size(key, v):
  if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
    raise ConfigError(key, v, "must be an integer >= 1, or -1 for the remaining devices")
  return v


@dataclasses.dataclass(frozen=True)
class MeshConfig(Block):
  """The ``mesh`` block: devices along each of :data:`MESH_AXES` (-1: the remaining ones; at most one -1).

  Attributes:
    data: data-parallel replicas.
    fsdp: parameter shards (ZeRO-3 style; parameters gathered per layer).
  """
  PREFIX = "mesh"
  data: int = setting(-1, _mesh_size, resume="free")
  fsdp: int = setting(1, _mesh_size, resume="free")

  def check(self, prefix):
    if self.data == -1 and self.fsdp == -1:
      raise ConfigError(f"{prefix}.fsdp", -1, f"at most one of {prefix}.data and {prefix}.fsdp may be -1")
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("heads", None),
    ("mlp", None),
    ("layers", None),
    ("modulation", None),
    ("patch", None),
    ("freq", None),
    ("text_embed", None),
    ("length", None),
    ("act_embed", None),
    ("act_heads", None),
    ("act_kv", None),
)


def make_mesh(data=-1, fsdp=1, devices=None):
  """A ``(data, fsdp)`` mesh; ``-1`` takes the remaining devices."""
  devices = np.asarray(jax.devices() if devices is None else devices)
  n = devices.size
  if data == -1 and fsdp == -1:
    raise ValueError("at most one of mesh.data and mesh.fsdp may be -1")
  if data == -1:
    data = n // fsdp
  if fsdp == -1:
    fsdp = n // data
  if data * fsdp != n:
    raise ValueError(f"mesh (data={data}, fsdp={fsdp}) needs {data * fsdp} devices; {n} available")
  return Mesh(devices.reshape(data, fsdp), MESH_AXES)


def rules_from_config(rules):
  """Config rules (a list of ``[name, axes]``) -> tuple of ``(name, axes)`` with tuples for lists."""
  out = []
  for name, axes in rules:
    out.append((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes))
  return tuple(out)


def _fit(spec, shape, mesh):
  """Replicates dimensions that the mesh axes do not divide (e.g. a bias of odd size)."""
  fixed = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    fixed.append(axes if dim % size == 0 else None)
    if dim % size:
      logging.debug("replicating a dimension of size %d that %s does not divide", dim, names)
  return P(*fixed)


def param_shardings(abstract_boxed, mesh, rules):
  """``NamedSharding`` tree for a boxed (logically partitioned) abstract variable tree."""
  specs = nn.get_partition_spec(abstract_boxed)
  mesh_specs = nn.logical_to_mesh(specs, rules)
  shapes = nn.unbox(abstract_boxed)
  return jax.tree_util.tree_map(lambda s, a: NamedSharding(mesh, _fit(s, a.shape, mesh)), mesh_specs, shapes,
                                is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh, rules, ndim):
  """Sharding of a batch array with ``ndim`` dims: first dim over the ``batch`` rule."""
  spec = nn.logical_to_mesh(P("batch", *([None] * (ndim - 1))), rules)
  return NamedSharding(mesh, spec)


def replicated(mesh):
  return NamedSharding(mesh, P())


# The global batch over the mesh (checked by train.py before anything is created).


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
