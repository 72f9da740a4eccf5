"""``impl=`` dispatch between the pure-``jnp`` references (``jaxwm.ops``) and the Pallas kernels
(``pallas_kernels``): the one module that imports both.

Each function has its reference's signature plus ``impl`` and ``interpret``:

- ``impl="xla"``: the reference (``interpret`` is ignored);
- ``impl="pallas_tpu"`` / ``"pallas_gpu"``: the Mosaic / Triton kernel (``interpret=True`` runs
  it on CPU);
- anything else: ``ValueError``. Nothing falls back silently.

Under a device mesh, XLA cannot partition a Pallas call: ``batch_axes`` (the mesh axes the leading
batch axis is sharded over, e.g. ``("data", "fsdp")``) runs the kernel per batch shard inside
``jax.shard_map``; every input and output is split on its leading axis.
"""

import jax
from jax.sharding import PartitionSpec as P

from jaxwm.ops import delta_rule as dr_ref
from jaxwm.ops import frame_sparse as fs_ref
from pallas_kernels import delta_rule as dr_kernels
from pallas_kernels import frame_sparse_attention as fs_kernels

IMPLS = ("xla", "pallas_tpu", "pallas_gpu")


def check_impl(impl, what):
  """Raises ``ValueError`` unless ``impl`` is one of :data:`IMPLS`; ``what`` names the operator."""
  if impl not in IMPLS:
    raise ValueError(f"{what} impl must be one of {IMPLS}; got impl={impl!r}")


def per_batch_shard(fn, batch_axes, *args):
  """``fn(*args)``, run per shard of the leading axis over mesh axes ``batch_axes`` of the current mesh
  (``jax.set_mesh``) when they split it; directly otherwise (no mesh, one device, or no axes)."""
  mesh = jax.sharding.get_abstract_mesh()
  axes = tuple(a for a in (batch_axes or ()) if not mesh.empty and a in mesh.shape and mesh.shape[a] > 1)
  if not axes:
    return fn(*args)
  return jax.shard_map(fn, mesh=mesh, in_specs=P(axes), out_specs=P(axes), check_vma=False)(*args)


def gathered_attention(q, k, v, frame_idx, *, tokens_per_frame, scale=None, impl="xla", interpret=False,
                       batch_axes=None):
  """ViewRope Eq. 12 (``jaxwm.ops.frame_sparse.gathered_attention``) by ``impl``.

  ``q [B, Fq*N, H, D]``, ``k, v [B, Fk*N, H, D]``, ``frame_idx [B, Fq, M]`` (-1 = unused)
  -> ``[B, Fq*N, H, D]`` in ``q``'s dtype. ``batch_axes``: see the module docstring (kernels only).
  """
  check_impl(impl, "frame-sparse attention")
  if impl == "xla":
    return fs_ref.gathered_attention(q, k, v, frame_idx, tokens_per_frame=tokens_per_frame, scale=scale)
  kernel = fs_kernels.tpu_attention if impl == "pallas_tpu" else fs_kernels.gpu_attention

  def fn(q, k, v, frame_idx):
    return kernel(q, k, v, frame_idx, tokens_per_frame=tokens_per_frame, scale=scale, interpret=interpret)

  return per_batch_shard(fn, batch_axes, q, k, v, frame_idx)


def frame_sparse_attention(q, k, v, *, tokens_per_frame, history, local_idx, top_k, sparsity="frame_topk",
                           num_samples=10, window=None, mode="topk", key=None, select_key=None, impl="xla",
                           interpret=False, batch_axes=None):
  """ViewRope Algorithm 1 (``jaxwm.ops.frame_sparse.frame_sparse_attention``): the reference's
  selection (Eqs. 9-11, always ``jnp``), then :func:`gathered_attention` (Eq. 12) by ``impl``.

  ``q [B, Fq*N, H, D]``, ``k, v [B, Fk*N, H, D]``, ``history [B, Fq, Fk]`` bool,
  ``local_idx [B, Fq, C]`` -> ``(out [B, Fq*N, H, D], selected [B, Fq, top_k or window])``.
  """
  check_impl(impl, "frame-sparse attention")
  idx, selected = fs_ref.attended_frames(q, k, tokens_per_frame=tokens_per_frame, history=history,
                                         local_idx=local_idx, top_k=top_k, sparsity=sparsity,
                                         num_samples=num_samples, window=window, mode=mode, key=key,
                                         select_key=select_key)
  out = gathered_attention(q, k, v, idx, tokens_per_frame=tokens_per_frame, impl=impl, interpret=interpret,
                           batch_axes=batch_axes)
  return out, selected


def delta_rule_chunked(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                       chunk_size=64, impl="xla", interpret=False, batch_axes=None):
  """The chunked gated delta rule (KDA / Gated DeltaNet, LOCI §3-4;
  ``jaxwm.ops.delta_rule.delta_rule_chunked``) by ``impl``.

  ``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``g [B, T, H(, K)]``, ``beta [B, T, H]``,
  ``initial_state [B, H, K, V]`` -> ``(o [B, T, H, V], final_state [B, H, K, V] or None)``.
  """
  check_impl(impl, "delta-rule")
  kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state, chunk_size=chunk_size)
  if impl == "xla":
    return dr_ref.delta_rule_chunked(q, k, v, g, beta, **kw)
  kernel = dr_kernels.tpu_delta_rule if impl == "pallas_tpu" else dr_kernels.gpu_delta_rule
  kw["output_final_state"] = True  # shard_map needs every output an array
  kw.pop("initial_state")

  def fn(q, k, v, g, beta, s0):
    return kernel(q, k, v, g, beta, initial_state=s0, interpret=interpret, **kw)

  s0 = initial_state
  if s0 is None:
    s0 = jax.numpy.zeros((q.shape[0], q.shape[2], q.shape[3], v.shape[3]), jax.numpy.float32)
  o, state = per_batch_shard(fn, batch_axes, q, k, v, g, beta, s0)
  return o, (state if output_final_state else None)
