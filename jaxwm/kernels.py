"""``impl=`` dispatch between the pure-``jnp`` references (``jaxwm.ops``) and the Pallas kernels
(``pallas_kernels``): the one module that imports both.

Each function has its reference's signature plus ``impl`` and ``interpret``:

- ``impl="xla"``: the reference (``interpret`` is ignored);
- another name of the operator's row in :data:`IMPLEMENTATIONS` (``"pallas_tpu"`` / ``"pallas_gpu"``: the Mosaic /
  Triton kernel, ``interpret=True`` runs it on CPU; the delta rule's ``"cpu_flash"``: a C++ kernel for XLA:CPU,
  ``xla_kernels.cpu_delta_rule``);
- anything else: ``ValueError``. Nothing falls back silently.

A new kernel of an operator is one file in ``pallas_kernels/`` (the reference's signature plus ``interpret``)
(or ``xla_kernels/``: a C++ kernel for XLA:CPU) and one line in its row of :data:`IMPLEMENTATIONS` (or
:func:`register_implementation` at run time);
``model.attention.impl`` / ``model.loci.impl`` then accept its name.

Dense attention with a token mask (:func:`dot_product_attention`, ``model.attention_impl``) has its
own names, :data:`ATTENTION_IMPLS`: ``"xla"`` (the reference), ``"xla_lse"`` (the same maths with a backward that
keeps the log-sum-exp instead of the probabilities, ``xla_kernels.softmax_attention``: faster and leaner on CPU),
``"cpu_flash"`` (the same maths as one C++ kernel for XLA:CPU, ``xla_kernels.cpu_attention``: float32, masks shared
by the heads), ``"splash"`` (TPU splash attention,
``pallas_kernels.splash_attention``), ``"cudnn"`` (``jax.nn.dot_product_attention`` with cuDNN) and
``"auto"`` (the fastest that takes the inputs where the program runs: :func:`resolve_attention_impl`; logged).
WorldRoPE's per-view keys have their own entry, :func:`per_view_attention` (``xla``, ``xla_lse``, ``cpu_flash``), and
so do their expected rotary factors, :func:`view_factors` (``xla``, ``cpu_flash``; :func:`resolve_view_factors_impl`
maps ``model.attention_impl`` to them).

Under a device mesh, XLA cannot partition a Pallas call: ``batch_axes`` (the mesh axes the leading
batch axis is sharded over, e.g. ``("data", "fsdp")``) runs the kernel per batch shard inside
``jax.shard_map``; every input and output is split on its leading axis (splash also splits heads
over ``head_axes``).
"""

import functools
import logging

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir
from jax.sharding import PartitionSpec as P

from jaxwm.ops import attention as attn_ref
from jaxwm.ops import delta_rule as dr_ref
from jaxwm.ops import frame_sparse as fs_ref
from jaxwm.ops import view_factors as vf_ref
from pallas_kernels import delta_rule as dr_kernels
from pallas_kernels import frame_sparse_attention as fs_kernels
from pallas_kernels import splash_attention as splash_kernel
from xla_kernels import cpu_attention
from xla_kernels import cpu_delta_rule
from xla_kernels import cpu_view_factors
from xla_kernels import softmax_attention as xla_attention

REFERENCE = "xla"


def _cpu_delta_rule(q, k, v, g, beta, *, initial_state=None, **kw):
  """``xla_kernels.cpu_delta_rule.delta_rule`` (a C++ kernel for XLA:CPU); lowering it for another platform raises
  ``ValueError``."""
  what = "model.loci.impl='cpu_flash' (a CPU kernel; 'pallas_tpu' on TPU, 'pallas_gpu' on GPU, 'xla' anywhere)"
  args = (q, k, v, g, beta) + (() if initial_state is None else (initial_state,))
  return only_on("cpu", what, lambda *a: cpu_delta_rule.delta_rule(*a[:5], initial_state=(a[5:] or (None,))[0], **kw),
                 *args)


# operator -> {impl name: kernel}; the reference (REFERENCE) is the operator's jaxwm.ops function.
IMPLEMENTATIONS = {
    "frame_sparse_attention": {  # gathered attention, ViewRope Eq. 12 (model.attention.impl)
        "pallas_tpu": fs_kernels.tpu_attention,
        "pallas_gpu": fs_kernels.gpu_attention,
    },
    "delta_rule": {  # the chunked gated delta rule, LOCI §3-4 (model.loci.impl)
        "pallas_tpu": dr_kernels.tpu_delta_rule,
        "pallas_gpu": dr_kernels.gpu_delta_rule,
        "cpu_flash": _cpu_delta_rule,
    },
}
ATTENTION_IMPLS = ("xla", "xla_lse", "splash", "cudnn", "cpu_flash", "auto")  # dense attention (model.attention_impl)


def impls(op):
  """The ``impl`` names of operator ``op`` (a key of :data:`IMPLEMENTATIONS`), the reference first."""
  return (REFERENCE, *IMPLEMENTATIONS[op])


def register_implementation(op, name, kernel):
  """Adds ``kernel`` (the reference's signature plus ``interpret``) as ``impl=name`` of ``op``; returns it."""
  if op not in IMPLEMENTATIONS:
    raise ValueError(f"op must be one of {tuple(IMPLEMENTATIONS)}; got {op!r}")
  if name == REFERENCE or IMPLEMENTATIONS[op].get(name, kernel) is not kernel:
    raise ValueError(f"{op} already has an implementation {name!r}")
  IMPLEMENTATIONS[op][name] = kernel
  return kernel


def kernel_of(op, impl, what):
  """The kernel of ``op`` called ``impl`` (None for the reference); ``ValueError`` naming ``what`` (the operator,
  in words), the value and the names allowed otherwise."""
  if impl == REFERENCE:
    return None
  if impl not in IMPLEMENTATIONS[op]:
    raise ValueError(f"{what} impl must be one of {impls(op)}; got impl={impl!r}")
  return IMPLEMENTATIONS[op][impl]


def _split_axes(mesh, axes):
  return tuple(a for a in (axes or ()) if not mesh.empty and a in mesh.shape and mesh.shape[a] > 1)


def per_batch_shard(fn, batch_axes, *args, head_axes=None, specs=None):
  """``fn(*args)``, run per shard of the leading axis over mesh axes ``batch_axes`` of the current mesh
  (``jax.set_mesh``) when they split it; directly otherwise (no mesh, one device, or no axes).

  ``specs(batch, heads) -> (in_specs, out_specs)``, given the axes of ``batch_axes`` and ``head_axes``
  that split the mesh (None when none do), places other axes (e.g. heads, or a mask shared by the
  batch); by default every input and output is split on its leading axis over the batch axes.
  """
  mesh = jax.sharding.get_abstract_mesh()
  batch = _split_axes(mesh, batch_axes)
  heads = tuple(a for a in _split_axes(mesh, head_axes) if a not in batch)
  if not batch and not (heads and specs):
    return fn(*args)
  in_specs, out_specs = (P(batch), P(batch)) if specs is None else specs(batch or None, heads or None)
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)


def _refuse(message, platforms):
  raise ValueError(f"{message} cannot be lowered for platform {', '.join(platforms)}")


_refused = jex_core.Primitive("jaxwm_kernel_refused")
_refused.def_abstract_eval(lambda x, **_: x)
_refused.def_impl(lambda x, *, message: _refuse(message, (jax.default_backend(),)))
mlir.register_lowering(_refused, lambda ctx, x, *, message: _refuse(message, ctx.module_context.platforms))
batching.defvectorized(_refused)


def only_on(platform, what, fn, *args):
  """``fn(*args)`` where the program is lowered for ``platform``; lowering it for any other platform raises
  ``ValueError`` naming ``what`` and that platform (``jax.lax.platform_dependent``: decided when lowering,
  so tracing and ``jax.eval_shape`` anywhere, and ahead-of-time compiles for abstract TPUs, work)."""

  def refuse(a):
    return _refused.bind(jnp.zeros(a.shape, a.dtype), message=what)

  @jax.custom_vjp
  def refused(*args):
    return jax.tree.map(refuse, jax.eval_shape(fn, *args))

  avals = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)

  def refused_fwd(*args):
    return refused(*args), None

  def refused_bwd(_, ct):  # a gradient-only program keeps no forward: refuse here too
    del ct
    return jax.tree.map(refuse, avals)

  refused.defvjp(refused_fwd, refused_bwd)
  return jax.lax.platform_dependent(*args, **{platform: fn}, default=refused)


def target_platform():
  """The platform being traced for: the current mesh's devices' (``jax.set_mesh``, abstract TPU devices
  of an ahead-of-time compile included), else ``jax.default_backend()``."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  return device.platform if device is not None else jax.default_backend()


def resolve_attention_impl(impl, arrays=(), mask=None, per_view=False):
  """``impl`` of :func:`dot_product_attention` (``per_view``: :func:`per_view_attention`); ``"auto"`` resolved for
  :func:`target_platform` and the inputs (``arrays``: ``q, k, v`` (and the factors), ``mask``), logged:

  - CPU: ``cpu_flash`` where it takes the inputs (float32, a mask shared by the heads, its C++ kernel built: a
    compiler found; ``cpu_attention.unsupported``), else ``xla_lse`` (the log names the reason);
  - TPU: ``splash``; CUDA GPU: ``cudnn`` for bfloat16 / float16 inputs; ``xla_lse`` otherwise and for per-view keys.

  ``ValueError`` naming the value and :data:`ATTENTION_IMPLS` otherwise."""
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f"model.attention_impl={impl!r}: must be one of {ATTENTION_IMPLS}")
  if impl != "auto":
    return impl
  platform = target_platform()
  why = ""
  if platform == "cpu":
    why = cpu_attention.unsupported(arrays, mask)
    impl = "xla_lse" if why else "cpu_flash"
  elif per_view:
    impl = "xla_lse"
  elif platform == "tpu":
    impl = "splash"
  elif platform in ("gpu", "cuda") and arrays and all(a.dtype in (jnp.bfloat16, jnp.float16) for a in arrays):
    impl = "cudnn"
  else:
    impl = "xla_lse"
  logging.info("model.attention_impl 'auto' resolved to %r for platform %r%s", impl, platform,
               f" (cpu_flash: {why})" if why else "")
  return impl


def dot_product_attention(q, k, v, mask=None, *, scale=None, impl="xla", interpret=False, batch_axes=None,
                          head_axes=None, block=512, frame_block=None):
  """Dense attention with a boolean token mask (``jaxwm.ops.attention.dot_product_attention``) by ``impl``
  (:data:`ATTENTION_IMPLS`).

  ``q [B, Lq, H, D]``, ``k, v [B, Lk, H, D]``, ``mask`` bool ``[1 or B, (1 or H,) Lq, Lk]`` (True = attend;
  NumPy: a static splash mask; a :class:`jaxwm.ops.attention.StaticFrameMask`: static and frame-level, never
  materialised by splash; a :class:`jaxwm.ops.attention.FrameMask`: traced and frame-level, splash tiles frames
  with its blocks and never builds the token mask; None: all) -> ``[B, Lq, H, D]`` in ``q``'s dtype. ``splash``
  runs on a TPU (or with ``interpret=True`` on CPU) per batch shard over ``batch_axes`` and head shard over
  ``head_axes`` of the current mesh, in blocks of ``block`` tokens (``FrameMask``: frame-aligned blocks of at most
  ``frame_block``); lowering it for another platform
  raises ``ValueError`` (:func:`only_on`; nothing falls back). ``cudnn`` raises ``ValueError`` when
  traced where jax finds no cuDNN.
  """
  impl = resolve_attention_impl(impl, (q, k, v), mask)
  if impl == "cudnn":
    try:
      return attn_ref.dot_product_attention(q, k, v, mask, scale=scale, impl="cudnn")
    except RuntimeError as e:  # jax: "cuDNN is not detected." (no CUDA GPU / jax cuda plugin)
      raise ValueError(f"model.attention_impl='cudnn' needs a CUDA GPU with cuDNN: {e}") from e
  if impl == "xla":
    return attn_ref.dot_product_attention(q, k, v, mask, scale=scale)
  if impl == "xla_lse":  # jnp: XLA partitions it under a mesh like the reference
    return xla_attention.attention(q, k, v, mask, scale=scale)
  if impl == "cpu_flash":
    return _cpu_flash(q, k, v, mask, scale, batch_axes)
  frame, per_frame = None, None
  if isinstance(mask, attn_ref.StaticFrameMask):  # splash computes its blocks on the host, no [L, L] array
    frame, mask = (mask.frames, mask.tokens_per_frame), None
  elif isinstance(mask, attn_ref.FrameMask):  # traced: frame-aligned blocks, tables from the frame mask
    per_frame, mask = mask.tokens_per_frame, jnp.asarray(mask.frames)
  static = splash_kernel.static_mask(mask)  # [Hm, Lq, Lk] NumPy, or None
  if static is not None and static.shape[0] > 1 and _split_axes(jax.sharding.get_abstract_mesh(), head_axes):
    static = None  # per-head masks follow their heads' shards
  dynamic = mask is not None and static is None

  def fn(q, k, v, *m):
    mask = m[0] if dynamic else None if static is None else static[None]
    fm = frame if per_frame is None else (mask, per_frame)
    mask = None if per_frame is not None else mask
    kernel = functools.partial(splash_kernel.attention, scale=scale, block=block, interpret=interpret, frame_mask=fm,
                               frame_block=frame_block or splash_kernel.FRAME_BLOCK)
    if interpret:
      return kernel(q, k, v, mask)
    return only_on("tpu", "model.attention_impl='splash' (a TPU kernel; model.attention.interpret=True runs it on "
                   "CPU, 'cudnn' on GPU, 'xla' anywhere)", lambda q, k, v: kernel(q, k, v, mask), q, k, v)

  def specs(batch, heads):
    qkv = P(batch, None, heads, None)
    if not dynamic:
      return (qkv,) * 3, qkv
    m_batch = batch if mask.shape[0] > 1 else None
    m = P(m_batch, None, None) if mask.ndim == 3 else P(m_batch, heads if mask.shape[1] > 1 else None, None, None)
    return (qkv,) * 3 + (m,), qkv

  args = (q, k, v, jnp.asarray(mask)) if dynamic else (q, k, v)
  return per_batch_shard(fn, batch_axes, *args, head_axes=head_axes, specs=specs)


def _cpu_flash(q, k, v, mask, scale, batch_axes):
  """``cpu_attention.attention`` (a C++ kernel for XLA:CPU) per batch shard; lowering it for another platform raises
  ``ValueError``."""
  mask = cpu_attention.token_mask(mask, q.shape[0], q.shape[1], k.shape[1])
  what = "model.attention_impl='cpu_flash' (a CPU kernel; 'cudnn' on GPU, 'splash' on TPU, 'xla' anywhere)"

  def fn(q, k, v, *m):
    return only_on("cpu", what, lambda q, k, v, *m: cpu_attention.attention(q, k, v, *m, scale=scale), q, k, v, *m)

  def specs(batch, heads):
    del heads
    qkv = P(batch, None, None, None)
    return (qkv,) * 3 + (() if mask is None else (P(batch if mask.shape[0] > 1 else None, None, None),)), qkv

  return per_batch_shard(fn, batch_axes, q, k, v, *(() if mask is None else (mask,)), specs=specs)


def per_view_attention(q, k, v, factors, pairs, mask=None, *, scale, impl="xla", batch_axes=None):
  """Attention whose keys depend on the query frame (WorldRoPE; ``jaxwm.ops.attention.per_view_attention``) by
  ``impl``: ``"xla"`` the reference, ``"xla_lse"`` the log-sum-exp backward (``xla_kernels.softmax_attention`` over
  the reference's per-view logits), ``"cpu_flash"`` the C++ kernel, which rotates each view's keys itself
  (``xla_kernels.cpu_attention``, per batch shard over ``batch_axes``; lowering it for another platform raises
  ``ValueError``). ``"auto"`` resolves as for :func:`dot_product_attention`; a kernel without this form
  (``splash``, ``cudnn``) is refused (``ValueError``).

  ``q [B, F N, H, D]``, ``k [B, Lk, H, D]``, ``v [B, Lk, H, Dv]``, ``factors [B, F, Lk, P, 2]``, ``pairs`` the
  ``P`` rotated channel pairs (static), ``mask`` bool broadcastable to ``[B, F N, Lk]`` or None -> ``[B, F N, H, Dv]``
  in ``v``'s dtype.
  """
  impl = resolve_attention_impl(impl, (q, k, v, factors), mask, per_view=True)
  if impl == "xla":
    return attn_ref.per_view_attention(q, k, v, factors, pairs, mask, scale=scale)
  if impl == "xla_lse":
    logits = functools.partial(attn_ref.per_view_logits, scale=scale)
    return xla_attention.softmax_attention(logits, attn_ref.per_view_views(q, k, factors, pairs), v, mask)
  if impl == "cpu_flash":
    mask = cpu_attention.token_mask(mask, q.shape[0], q.shape[1], k.shape[1])
    what = "model.attention_impl='cpu_flash' (a CPU kernel; 'xla_lse' or 'xla' anywhere)"
    pairs = tuple(pairs)

    def kernel(q, k, v, factors, *m):
      return cpu_attention.per_view_attention(q, k, v, factors, pairs, *m, scale=scale)

    def fn(*args):
      return only_on("cpu", what, kernel, *args)

    def specs(batch, heads):
      del heads
      m = () if mask is None else (P(batch if mask.shape[0] > 1 else None),)
      return (P(batch),) * 4 + m, P(batch)

    out = per_batch_shard(fn, batch_axes, q, k, v, factors, *(() if mask is None else (mask,)), specs=specs)
    return out.astype(v.dtype)
  raise ValueError(f"model.attention_impl={impl!r}: attention with per-view keys (WorldRoPE) has the "
                   "implementations 'xla', 'xla_lse' and 'cpu_flash'")


def resolve_view_factors_impl(attention_impl):
  """The :func:`view_factors` impl that goes with ``model.attention_impl``: ``"cpu_flash"`` for ``"cpu_flash"``, and
  for ``"auto"`` where the program runs on CPU and the factors' C++ kernel builds here
  (``cpu_view_factors.unavailable``); ``"xla"`` (the reference) otherwise: the other attention kernels have no
  factor kernel. ``ValueError`` for a name not in :data:`ATTENTION_IMPLS`."""
  if attention_impl not in ATTENTION_IMPLS:
    raise ValueError(f"model.attention_impl={attention_impl!r}: must be one of {ATTENTION_IMPLS}")
  if attention_impl == "auto":
    return "cpu_flash" if target_platform() == "cpu" and not cpu_view_factors.unavailable() else "xla"
  return "cpu_flash" if attention_impl == "cpu_flash" else "xla"


def view_factors(gauss, q_intrinsics, q_c2w, freqs, pixels_per_token, *, impl="xla", per_view=False,
                 batch_axes=None):
  """WorldRoPE's expected rotary factors (``jaxwm.ops.view_factors.view_factors``) by ``impl``: ``"xla"`` the
  reference (``per_view``: its loop over views, the sampler's faster forward), ``"cpu_flash"`` the C++ kernel
  (``xla_kernels.cpu_view_factors``, per batch shard over ``batch_axes``; lowering it for another platform raises
  ``ValueError``).

  ``gauss``: ``mean [B, Lk, M, 3]``, ``root [B, Lk, M, 3, 3]``, ``alpha [B, Lk, M]``; ``q_intrinsics [B, F, 3, 3]``,
  ``q_c2w [B, F, 4, 4]``; ``freqs [P, 2]`` static -> ``factors [B, F, Lk, P, 2]`` float32.
  """
  if impl == REFERENCE:
    return vf_ref.view_factors(gauss, q_intrinsics, q_c2w, freqs, pixels_per_token, per_view=per_view)
  if impl != "cpu_flash":
    raise ValueError(f"WorldRoPE's view factors impl must be one of ('xla', 'cpu_flash'); got impl={impl!r}")
  what = "model.attention_impl='cpu_flash' (WorldRoPE's factors: a CPU kernel; 'xla_lse' or 'xla' anywhere)"

  def fn(mean, root, alpha, q_k, q_c2w):
    return only_on("cpu", what, lambda *a: cpu_view_factors.view_factors(
        dict(zip(("mean", "root", "alpha"), a[:3])), a[3], a[4], freqs, pixels_per_token),
                   mean, root, alpha, q_k, q_c2w)

  return per_batch_shard(fn, batch_axes, gauss["mean"], gauss["root"], gauss["alpha"], q_intrinsics, q_c2w)


def gathered_attention(q, k, v, frame_idx, *, tokens_per_frame, scale=None, impl="xla", interpret=False,
                       batch_axes=None):
  """ViewRope Eq. 12 (``jaxwm.ops.frame_sparse.gathered_attention``) by ``impl``.

  ``q [B, Fq*N, H, D]``, ``k, v [B, Fk*N, H, D]``, ``frame_idx [B, Fq, M]`` (-1 = unused)
  -> ``[B, Fq*N, H, D]`` in ``q``'s dtype. ``batch_axes``: see the module docstring (kernels only).
  """
  kernel = kernel_of("frame_sparse_attention", impl, "frame-sparse attention")
  if kernel is None:
    return fs_ref.gathered_attention(q, k, v, frame_idx, tokens_per_frame=tokens_per_frame, scale=scale)

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
  kernel_of("frame_sparse_attention", impl, "frame-sparse attention")  # refuses before the selection is traced
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
  kernel = kernel_of("delta_rule", impl, "delta-rule")
  kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state, chunk_size=chunk_size)
  if kernel is None:
    return dr_ref.delta_rule_chunked(q, k, v, g, beta, **kw)
  kw["output_final_state"] = True  # shard_map needs every output an array
  kw.pop("initial_state")

  def fn(q, k, v, g, beta, s0):
    return kernel(q, k, v, g, beta, initial_state=s0, interpret=interpret, **kw)

  s0 = initial_state
  if s0 is None:
    s0 = jnp.zeros((q.shape[0], q.shape[2], q.shape[3], v.shape[3]), jnp.float32)
  o, state = per_batch_shard(fn, batch_axes, q, k, v, g, beta, s0)
  return o, (state if output_final_state else None)


def delta_rule_write(k, v, beta, *, initial_state=None, chunk_size=64, impl="xla", interpret=False, batch_axes=None):
  """The state after writes alone, no decay, no read (LOCI's chunk write; ``jaxwm.ops.delta_rule.delta_rule_write``)
  by ``impl``: ``xla`` computes only the write's terms; a kernel runs its chunked scan with zero queries and zero
  decays, which computes the same state.

  ``k [B, T, H, K]``, ``v [B, T, H, V]``, ``beta [B, T, H]``, ``initial_state [B, H, K, V]`` ->
  ``final_state [B, H, K, V]`` float32.
  """
  if kernel_of("delta_rule", impl, "delta-rule") is None:
    return dr_ref.delta_rule_write(k, v, beta, initial_state=initial_state, chunk_size=chunk_size)
  zeros = jnp.zeros_like(k)
  return delta_rule_chunked(zeros, k, v, zeros, beta, initial_state=initial_state, output_final_state=True,
                            chunk_size=chunk_size, impl=impl, interpret=interpret, batch_axes=batch_axes)[1]
