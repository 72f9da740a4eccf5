"""Device mesh and logical-axis sharding rules (docs/design.md §11).

Parameters and activations carry logical axis names (``embed``, ``heads``, ``mlp``,
``layers``, ``batch``, ...). A rule table from the config maps them to mesh axes; the
default is FSDP: parameters sharded on ``embed`` over ``fsdp``, the batch over
``(data, fsdp)``.
"""

import logging

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp")
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
