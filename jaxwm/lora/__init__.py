"""Low-rank adapters (LoRA) on the backbone's attention and FFN kernels, as a parameter-tree transform.

The model is not rewritten: an adapter is a small tree of factors beside the parameters, and a targeted
kernel ``W [..., in, out]`` becomes

    W' = W + (alpha / r) * A @ B,    A [..., in, r],  B [..., r, out]

(leading axes: the layer axis of scanned stacks ``[L, in, out]``; the factors carry it too). ``B`` starts
at zero, so at initialisation ``W' = W`` bit for bit. Which kernels are targeted is a :class:`LoraSpec`
of path regexes over ``"/"``-joined parameter paths (``blocks/attn1/to_q/kernel``); by default the
attention projections (``to_q``, ``to_k``, ``to_v``, ``to_out`` of self- and cross-attention) and the
FFN (``ffn_in``, ``ffn_out``) of every block stack (``blocks`` or ``blocks_<start>_<end>``). The
camera/pose path is never targeted: Plücker injection (``plucker_in``, ``plucker_out``), MRoPE's pose
MLP and SE(3) residuals (``mrope_*``), WorldRoPE's ``depth_head``, LOCI's memory branch (``memory/*``,
``mem_gate``), and also embeddings (``patch_embedding``, ``condition_embedder``, ``text_embedder``),
norms, biases, modulation tables (``scale_shift_table``) and the head (``proj_out``). The named set
``blocks_io`` (:data:`TARGET_SETS`, ``distill.targets``) adds the patch embedding, the time embedding and the
head; the camera path stays out.

Two ways to run an adapted model:

- merged (:func:`apply_lora` / :func:`merge`): ``W'`` materialised, the forward unchanged; for
  inference merge once before streaming (no per-step cost);
- unmerged (:func:`unmerged_params` + :func:`unmerged`): the factors sit beside each kernel and every
  targeted ``nn.Dense`` adds ``(alpha/r) (x A) B`` to its output; ``W'`` is never materialised.

Training keeps ``{"base": params, "lora": adapter}``; :func:`lora_optimizer` updates the ``lora``
factors only, and the loss applies the adapter to ``stop_gradient(base)`` (no weight gradients of the
base are computed). Adapters are saved as their own small checkpoint with the spec and a fingerprint of
the base's parameter shapes, and checked against the base they are applied to when loaded
(:mod:`jaxwm.lora.adapters`: the I/O, apart from these maths).
"""

import contextlib
import dataclasses
import re
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

_STACK = r"^blocks(_\d+_\d+)?/"
DEFAULT_INCLUDE = (
    _STACK + r"attn[12]/to_(q|k|v|out)/kernel$",  # self- and cross-attention projections
    _STACK + r"ffn_(in|out)/kernel$",
)
DEFAULT_EXCLUDE = (
    r"cam|pose|plucker|mrope|worldrope|depth_head|mem|loci",  # camera/pose path, LOCI memory branch
    r"embed",  # patch, time and text embeddings
    r"norm",
    r"(^|/)bias$",
    r"scale_shift_table",  # modulation tables
    r"(^|/)proj_out/",  # the head
)
# The backbone's input and output maps: the patch embedding, the time embedding (which sets every block's
# modulation) and the head. A 1-step student must turn pure noise into a frame in one velocity, which means
# cancelling its input through all of these (``targets="blocks_io"``).
IO_INCLUDE = (
    r"^patch_embedding/kernel$",
    r"^condition_embedder/time_(embedder_[12]|proj)/kernel$",
    r"^proj_out/kernel$",
)
IO_EXCLUDE = tuple(p for p in DEFAULT_EXCLUDE if p not in (r"embed", r"(^|/)proj_out/")) + (r"text",)
# Named target sets (``distill.targets``): ``(include, exclude)``.
TARGET_SETS = {
    "blocks": (DEFAULT_INCLUDE, DEFAULT_EXCLUDE),
    "blocks_io": (DEFAULT_INCLUDE + IO_INCLUDE, IO_EXCLUDE),
}
FACTORS = ("a", "b")
ADAPTER_FIELD = "lora"  # the state field of an adapter checkpoint and the trained subtree of a LoRA state


class AdapterMismatchError(ValueError):
  """An adapter does not fit a base: a target is missing or has another shape (the message is one line)."""


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """Which kernels get factors, their rank and scale.

  Attributes:
    rank: ``r``, the inner dimension of ``A [..., in, r]`` and ``B [..., r, out]``.
    alpha: the update is scaled by ``alpha / r``.
    include: regexes (``re.search``) over ``"/"``-joined parameter paths; a leaf matching any is a
      candidate.
    exclude: regexes; a candidate matching any is not targeted (exclusion wins). Only leaves of rank
      >= 2 are targeted (``[..., in, out]``).
  """
  rank: int = 128
  alpha: float = 128.0
  include: tuple = DEFAULT_INCLUDE
  exclude: tuple = DEFAULT_EXCLUDE

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"LoraSpec.rank must be an int >= 1; got {self.rank!r}")
    object.__setattr__(self, "include", tuple(self.include))
    object.__setattr__(self, "exclude", tuple(self.exclude))
    for pattern in self.include + self.exclude:
      re.compile(pattern)

  @classmethod
  def of(cls, targets, rank, alpha):
    """The spec of a named target set (:data:`TARGET_SETS`)."""
    if targets not in TARGET_SETS:
      raise ValueError(f"targets={targets!r}: must be one of {', '.join(map(repr, TARGET_SETS))}")
    include, exclude = TARGET_SETS[targets]
    return cls(rank=rank, alpha=alpha, include=include, exclude=exclude)

  @property
  def scale(self):
    """``alpha / r``."""
    return float(self.alpha) / self.rank

  def targets(self, path, leaf):
    """Whether the parameter at ``path`` (``"a/b/kernel"``) with ``leaf`` (anything with ``.shape``) gets factors."""
    return (len(getattr(leaf, "shape", ())) >= 2 and any(re.search(p, path) for p in self.include)
            and not any(re.search(p, path) for p in self.exclude))

  def to_dict(self):
    return {"rank": self.rank, "alpha": float(self.alpha), "include": list(self.include),
            "exclude": list(self.exclude)}

  @classmethod
  def from_dict(cls, d):
    return cls(rank=int(d["rank"]), alpha=float(d["alpha"]), include=tuple(d["include"]),
               exclude=tuple(d["exclude"]))


def flat_paths(tree, prefix=()):
  """``{"a/b/c": leaf}`` of nested mappings (leaves: anything else): the paths :class:`LoraSpec` matches."""
  out = {}
  for k, v in tree.items():
    key = prefix + (str(k),)
    if isinstance(v, Mapping):
      out.update(flat_paths(v, key))
    else:
      out["/".join(key)] = v
  return out


def nest(flat):
  """Inverse of :func:`flat_paths` (plain dicts)."""
  out = {}
  for path, v in flat.items():
    *head, last = path.split("/")
    node = out
    for k in head:
      node = node.setdefault(k, {})
    node[last] = v
  return out


def _is_factor_pair(node):
  return isinstance(node, Mapping) and set(node) == set(FACTORS) and not any(isinstance(v, Mapping)
                                                                              for v in node.values())


def factors(adapter):
  """``{target path: (a, b)}`` of an adapter tree (the path of the kernel each pair adapts)."""
  out = {}

  def walk(node, prefix):
    if _is_factor_pair(node):
      out["/".join(prefix)] = (node["a"], node["b"])
      return
    if not isinstance(node, Mapping):
      raise ValueError(f"adapter leaf at {'/'.join(prefix) or '<root>'} is not under an {{'a', 'b'}} factor pair")
    for k, v in node.items():
      walk(v, prefix + (str(k),))

  walk(adapter, ())
  return out


def lora_targets(params, spec):
  """Sorted paths of the parameters of ``params`` that ``spec`` targets."""
  return sorted(p for p, leaf in flat_paths(params).items() if spec.targets(p, leaf))


def init_lora(key, params, spec):
  """A fresh adapter for ``params`` (unboxed; arrays or ``jax.ShapeDtypeStruct``).

  For every targeted kernel ``W [..., in, out]``: ``a [..., in, r] ~ N(0, 1/in)``, ``b [..., r, out] = 0``
  (``W``'s dtype), so ``apply_lora(params, init_lora(...), spec)`` equals ``params`` bit for bit.

  Returns:
    The adapter: nested dicts mirroring the targeted paths, each kernel replaced by ``{"a": .., "b": ..}``.
    Raises ``ValueError`` when ``spec`` targets nothing.
  """
  targets = lora_targets(params, spec)
  if not targets:
    raise ValueError(f"LoRA spec targets no parameter (include={list(spec.include)}, exclude={list(spec.exclude)})")
  flat = flat_paths(params)
  out = {}
  for i, path in enumerate(targets):
    w = flat[path]
    *lead, n_in, n_out = w.shape
    a = jax.random.normal(jax.random.fold_in(key, i), (*lead, n_in, spec.rank), w.dtype) * n_in**-0.5
    out[path] = {"a": a, "b": jnp.zeros((*lead, spec.rank, n_out), w.dtype)}
  return nest(out)


def _delta(a, b, scale):
  """``scale * a @ b`` in float32 at full matmul precision: ``[..., in, r] x [..., r, out] -> [..., in, out]``."""
  return scale * jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)


def _replace(tree, updates, prefix=()):
  """``tree`` with the leaves at ``updates``' paths replaced by ``updates[path](leaf)`` (other nodes shared)."""
  out = {}
  for k, v in tree.items():
    path = "/".join(prefix + (str(k),))
    if isinstance(v, Mapping):
      out[k] = _replace(v, updates, prefix + (str(k),))
    else:
      out[k] = updates[path](v) if path in updates else v
  return out


def check_fits(flat_params, pairs, rank, where):
  """Raises a one-line :class:`AdapterMismatchError` unless every ``{path: (a, b)}`` (anything with ``.shape``)
  fits a kernel of ``flat_params`` (``a [..., in, rank]``, ``b [..., rank, out]`` of ``W [..., in, out]``)."""
  for path, (a, b) in sorted(pairs.items()):
    if path not in flat_params:
      raise AdapterMismatchError(f"{where}: target {path} is not a parameter of the base model "
                                 f"({len(pairs)} targets in the adapter)")
    w_shape, a_shape, b_shape = (tuple(x.shape) for x in (flat_params[path], a, b))
    want = a_shape[:-1] + b_shape[-1:]
    if a_shape[-1] != rank or b_shape[-2] != rank or a_shape[:-2] != b_shape[:-2] or w_shape != want:
      raise AdapterMismatchError(f"{where}: target {path} has shape {w_shape} in the base; the adapter's factors "
                                 f"a {a_shape}, b {b_shape} (rank {rank}) fit {want}")


def apply_lora(params, adapter, spec, enabled=True):
  """``params`` with every adapted kernel replaced by ``W' = W + (alpha/r) * a @ b`` (pure, jit-able).

  Args:
    params: the base parameters (unboxed nested dicts).
    adapter: factors from :func:`init_lora` / :func:`jaxwm.lora.adapters.load_adapter` (``a [..., in, r]``, ``b [..., r, out]``).
    spec: the :class:`LoraSpec` (its ``alpha / rank`` scales the update).
    enabled: a Python bool; False returns ``params`` itself.

  Differentiable in both arguments; train the adapter alone with
  ``loss(apply_lora(jax.lax.stop_gradient(base), adapter, spec))``. Untouched leaves are shared with
  ``params``. Raises :class:`AdapterMismatchError` when a target is missing or of another shape.
  """
  if not enabled:
    return params
  pairs = factors(adapter)
  check_fits(flat_paths(params), pairs, spec.rank, "apply_lora")
  scale = spec.scale
  updates = {path: (lambda w, a=a, b=b: (w.astype(jnp.float32) + _delta(a, b, scale)).astype(w.dtype))
             for path, (a, b) in pairs.items()}
  return _replace(params, updates)


def merge(params, adapter, spec):
  """The adapted parameters for inference: :func:`apply_lora` once, before sampling, so the streaming
  forward runs the unchanged model on ``W' = W + (alpha/r) a @ b`` at no extra cost per step."""
  return apply_lora(params, adapter, spec, enabled=True)


def lora_param_count(adapter):
  """Number of adapter values: ``sum over targets of r * (in + out)`` (times the layers of stacked kernels)."""
  return int(sum(a.size + b.size for a, b in factors(adapter).values()))


def unmerged_params(params, adapter):
  """``params`` with each target's factors beside its kernel (``.../to_q/{kernel, bias, lora_a, lora_b}``),
  for a forward under :func:`unmerged`. Targets must be ``nn.Dense`` kernels (paths ending in ``/kernel``)."""
  pairs, flat = factors(adapter), flat_paths(params)
  for path, (a, b) in pairs.items():
    check_fits(flat, {path: (a, b)}, a.shape[-1], "unmerged_params")
  extra = {}
  for path, (a, b) in pairs.items():
    module, _, leaf = path.rpartition("/")
    if leaf != "kernel":
      raise ValueError(f"unmerged LoRA adapts nn.Dense kernels only; target {path} is not a '.../kernel'")
    extra[f"{module}/lora_a"], extra[f"{module}/lora_b"] = a, b
  return nest({**flat, **extra})


@contextlib.contextmanager
def unmerged(spec):
  """Within this context every ``nn.Dense`` whose parameters hold ``lora_a [in, r]``, ``lora_b [r, out]``
  (:func:`unmerged_params`; scanned stacks slice them per layer) returns ``x W + bias + (alpha/r) (x a) b``.

  Enter it inside the traced function (e.g. around ``model.apply`` in the loss), so tracing sees it.
  """
  scale = spec.scale

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    mod = context.module
    if (context.method_name != "__call__" or not isinstance(mod, nn.Dense)
        or not mod.has_variable("params", "lora_a")):
      return out
    a, b = mod.get_variable("params", "lora_a"), mod.get_variable("params", "lora_b")
    x = args[0] if args else kwargs["inputs"]
    dt = mod.dtype or jnp.result_type(x, a)
    branch = jnp.matmul(jnp.matmul(x.astype(dt), a.astype(dt)), b.astype(dt))
    return out + (scale * branch).astype(out.dtype)

  with nn.intercept_methods(interceptor):
    yield


def combine(base, adapter):
  """The train-state parameters of LoRA training: ``{"base": base, "lora": adapter}``."""
  return {"base": base, ADAPTER_FIELD: adapter}


def trainable_mask(tree):
  """Bool tree shaped like ``tree = {"base": ..., "lora": ...}``: True on the adapter's factors only."""
  if not isinstance(tree, Mapping) or ADAPTER_FIELD not in tree:
    raise ValueError(f"trainable_mask expects {{'base': params, '{ADAPTER_FIELD}': adapter}} (see combine); "
                     f"got keys {list(tree) if isinstance(tree, Mapping) else type(tree).__name__}")
  return {k: jax.tree_util.tree_map(lambda _, t=(k == ADAPTER_FIELD): t, v) for k, v in tree.items()}


def lora_optimizer(tx):
  """``tx`` on the adapter factors of ``{"base", "lora"}`` trees; the base gets zero updates and no
  optimizer state (``optax.multi_transform`` with ``optax.set_to_zero``)."""

  def labels(tree):
    return jax.tree_util.tree_map(lambda t: "lora" if t else "frozen", trainable_mask(tree))

  return optax.multi_transform({"lora": tx, "frozen": optax.set_to_zero()}, labels)


def factor_specs(kernel_spec, ndim):
  """``(spec of a, spec of b)`` for factors of a kernel ``W [..., in, out]`` sharded as ``kernel_spec``: ``a
  [..., in, r]`` keeps ``W``'s leading and ``in`` axes' sharding, ``b [..., r, out]`` its leading and ``out``
  axes'; the rank axis is never split (so FSDP shards the factors and their optimizer state like the base)."""
  s = tuple(kernel_spec) + (None,) * (ndim - len(tuple(kernel_spec)))
  return P(*s[:-1], None), P(*s[:-2], None, s[-1])


def _key_name(k):
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def factor_shardings(tree, base_shardings, default):
  """Shardings for ``tree`` (any pytree holding adapters: an adapter, a distillation state with its optimizer
  states): a leaf whose key path ends in ``<kernel path>/a`` or ``/b`` of a kernel with a ``NamedSharding`` in
  ``base_shardings`` (a tree mirroring the base parameters) gets :func:`factor_specs` of it; every other leaf
  (step counters, scalars) ``default``."""
  flat = {p: sh for p, sh in flat_paths(base_shardings).items() if isinstance(sh, NamedSharding)}
  lengths = sorted({p.count("/") + 1 for p in flat})

  def pick(keypath, leaf):
    names = [_key_name(k) for k in keypath]
    ndim = len(getattr(leaf, "shape", ()))
    if names and names[-1] in FACTORS and ndim >= 2:
      for n in lengths:
        sh = flat.get("/".join(names[-1 - n:-1])) if len(names) > n else None
        if sh is not None:
          spec_a, spec_b = factor_specs(sh.spec, ndim)
          return NamedSharding(sh.mesh, spec_a if names[-1] == "a" else spec_b)
    return default

  return jax.tree_util.tree_map_with_path(pick, tree)
