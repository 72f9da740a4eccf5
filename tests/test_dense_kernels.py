"""Dense attention kernels chosen by ``model.attention_impl`` (``jaxwm.kernels.dot_product_attention``):

- TPU splash attention equals the reference in Pallas' interpret mode on the teacher-forcing layout's
  mask (odd tokens per frame, several blocks, static and dynamic masks, per-head and per-example
  masks, forward and gradients), and compiles with the real Mosaic compiler for abstract v5e / v5p
  chips under a 4-device mesh (``shard_map`` over the batch, or batch and heads), with no
  ``[L, L]`` score matrix left in the program;
- cuDNN: ``jax.nn.dot_product_attention(implementation="cudnn")`` needs cuDNN at trace time
  (``RuntimeError: cuDNN is not detected.`` here, refused as a ValueError), so its CUDA lowering is
  checked with jax's cuDNN version probe stubbed, and the XLA (``implementation=None``) path too;
- unknown names and kernels on the wrong platform are refused, nothing falls back.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import kernels
from jaxwm.ops.attention import expand_frame_mask
from jaxwm.ops import attention as attn_ref
from jaxwm.ops.attention import dot_product_attention as reference
from jaxwm.training.layout import teacher_forcing_layout

needs_libtpu = pytest.mark.skipif(__import__("importlib").util.find_spec("libtpu") is None,
                                  reason="libtpu (pip install 'jax[tpu]', in the test extras) compiles for TPUs")


def _tf_mask(num_frames, chunk, tokens_per_frame):
  """The teacher-forcing layout's frame mask ``[S, S]`` and its token mask ``[1, S*N, S*N]`` (NumPy)."""
  frames = teacher_forcing_layout(num_frames, chunk).mask
  return frames, np.asarray(expand_frame_mask(jnp.asarray(frames)[None], tokens_per_frame))


def _qkv(b, length, h, d, dtype=jnp.float32, seed=0):
  return tuple(jax.random.normal(k, (b, length, h, d), dtype) for k in jax.random.split(jax.random.key(seed), 3))


def _splash(mask, **kw):
  return lambda q, k, v: kernels.dot_product_attention(q, k, v, mask, impl="splash", interpret=True, block=128, **kw)


def test_splash_matches_the_reference_on_the_teacher_forcing_mask():
  """7 frames of 37 tokens (259 tokens: 3 blocks of 128 after padding), forward and gradients."""
  frames, tok = _tf_mask(5, 2, 37)
  assert frames.shape == (7, 7) and not frames.all()
  q, k, v = _qkv(2, tok.shape[-1], 2, 32)
  want = reference(q, k, v, jnp.asarray(tok))
  for mask in (tok, jnp.asarray(tok)):  # static (NumpyMask) and dynamic (traced) masks
    np.testing.assert_allclose(np.asarray(jax.jit(_splash(mask))(q, k, v)), np.asarray(want), atol=2e-6)
  cot = jax.random.normal(jax.random.key(1), want.shape)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * cot)  # pylint: disable=unnecessary-lambda-assignment
  grads = jax.jit(jax.grad(loss(_splash(jnp.asarray(tok))), (0, 1, 2)))(q, k, v)
  ref_grads = jax.grad(loss(lambda *a: reference(*a, jnp.asarray(tok))), (0, 1, 2))(q, k, v)
  for name, g, r in zip("qkv", grads, ref_grads):
    rel = float(jnp.abs(g - r).max() / jnp.abs(r).max())
    assert rel < 1e-5, (name, rel)


def test_splash_per_head_per_example_and_unmasked():
  """Per-head masks (ReWorld's head windows), one mask per example (each its own block tables) and no
  mask (padded keys masked by segment ids), against the reference."""
  frames, tok = _tf_mask(5, 2, 29)  # 7 frames, 203 tokens
  n, length, s = 29, tok.shape[-1], frames.shape[0]
  q, k, v = _qkv(2, length, 2, 16, seed=2)
  window = np.asarray(frames & (np.arange(s)[:, None] - np.arange(s)[None, :] < 2))
  per_head = np.stack([tok[0], np.asarray(expand_frame_mask(jnp.asarray(window)[None], n))[0]])[None]  # [1, H, L, L]
  per_example = np.concatenate([tok, per_head[:, 1]])  # [B, L, L]
  for mask in (jnp.asarray(per_head), per_head, jnp.asarray(per_example), None):
    want = reference(q, k, v, None if mask is None else jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(jax.jit(_splash(mask))(q, k, v)), np.asarray(want), atol=2e-6)
  g = jax.jit(jax.grad(lambda q: _splash(None)(q, k, v).sum()))(q)
  np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(lambda q: reference(q, k, v).sum())(q)), atol=1e-5)


@needs_libtpu
@pytest.mark.parametrize("topology,split", [("v5e:2x2", "batch"), ("v5p:2x2x1", "batch"), ("v5e:2x2", "heads")])
def test_splash_compiles_for_tpu_under_a_4_device_mesh(topology, split):
  """Wan heads (D = 128, bf16), 390 tokens per frame, 7 frames (2,730 tokens), forward and backward, under
  ``shard_map``: batch over ``(data, fsdp)``, or batch over ``data`` and heads over ``model`` with per-head masks."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxwm.training.compile_only import topology_devices  # pylint: disable=g-import-not-at-top
  frames, _ = _tf_mask(5, 2, 1)
  n, heads, d = 390, 4, 128
  length = frames.shape[0] * n
  axes = ("data", "fsdp") if split == "batch" else ("data", "model")
  mesh = Mesh(np.asarray(topology_devices(topology)[:4]).reshape(2, 2), axes)
  batch_axes, head_axes = (axes, None) if split == "batch" else (("data",), ("model",))
  b = 4 if split == "batch" else 2
  qkv_spec = P(batch_axes, None, head_axes, None)
  x = jax.ShapeDtypeStruct((b, length, heads, d), jnp.bfloat16, sharding=NamedSharding(mesh, qkv_spec))
  mask_shape = (1, length, length) if split == "batch" else (1, heads, length, length)
  mask = jax.ShapeDtypeStruct(mask_shape, jnp.bool_, sharding=NamedSharding(mesh, P()))

  def grads(q, k, v, m):
    f = lambda q, k, v: kernels.dot_product_attention(  # pylint: disable=unnecessary-lambda-assignment
        q, k, v, m, impl="splash", batch_axes=batch_axes, head_axes=head_axes).astype(jnp.float32).sum()
    return jax.grad(f, (0, 1, 2))(q, k, v)

  with jax.set_mesh(mesh):
    lowered = jax.jit(grads).lower(x, x, x, mask)
    assert "shard_map" in str(jax.make_jaxpr(grads)(x, x, x, mask))
  compiled = lowered.compile()
  text = compiled.as_text()
  assert text.count("tpu_custom_call") >= 2  # splash forward and fused backward: no XLA fallback
  pad = -(-length // 512) * 512
  assert not re.search(rf"f32\[[^\]]*\b({length}|{pad}),({length}|{pad})\b", text)  # no score matrix
  local_heads = heads // (1 if split == "batch" else 2)
  scores = local_heads * length * length * 4  # the reference's f32 scores of one call, per device
  # A traced mask reaches the kernel as its padded blocks in int32 (Mosaic has no bool memrefs): one
  # copy per mask head, which for per-head masks is as large as the scores themselves.
  mask_blocks = (1 if split == "batch" else local_heads) * pad * pad * 4
  assert compiled.memory_analysis().temp_size_in_bytes < (scores if split == "batch" else scores + mask_blocks)


@needs_libtpu
@pytest.mark.parametrize("n", [390, 256])
def test_splash_with_a_traced_per_head_frame_mask_compiles_for_tpu(n):
  """ReWorld's case: a traced per-head frame mask (head windows, chunk drop) with heads split over ``model``
  compiles with the real Mosaic compiler for v5p (forward, dq and dkv kernels), frames padded (390 -> 512) or
  not (256), and the step holds neither score matrices nor token-mask blocks."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxwm.training.compile_only import topology_devices  # pylint: disable=g-import-not-at-top
  s, heads, d = teacher_forcing_layout(5, 2).mask.shape[0], 4, 128
  length = s * n
  mesh = Mesh(np.asarray(topology_devices("v5p:2x2x1")[:4]).reshape(2, 2), ("data", "model"))
  x = jax.ShapeDtypeStruct((2, length, heads, d), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P(("data",), None, ("model",), None)))
  frames = jax.ShapeDtypeStruct((1, heads, s, s), jnp.bool_, sharding=NamedSharding(mesh, P()))

  def grads(q, k, v, m):
    f = lambda q, k, v: kernels.dot_product_attention(  # pylint: disable=unnecessary-lambda-assignment
        q, k, v, attn_ref.FrameMask(m, n), impl="splash", batch_axes=("data",), head_axes=("model",))
    return jax.grad(lambda *a: f(*a).astype(jnp.float32).sum(), (0, 1, 2))(q, k, v)

  with jax.set_mesh(mesh):
    compiled = jax.jit(grads).lower(x, x, x, frames).compile()
  text = compiled.as_text()
  assert text.count("tpu_custom_call") >= 3  # forward, dq, dkv
  scores = (heads // 2) * length * length * 4  # one device's f32 scores
  assert compiled.memory_analysis().temp_size_in_bytes < scores // 4


CUDNN_CALLS = ("__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaScaleBiasSoftmaxBackward")


def _cuda_export(fn, *args):
  from jax import export  # pylint: disable=g-import-not-at-top
  checks = [export.DisabledSafetyCheck.custom_call(t) for t in CUDNN_CALLS]  # no compatibility guarantee
  return export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()


def test_cudnn_lowers_for_cuda(monkeypatch):
  """``impl="cudnn"``: refused here (no cuDNN at trace time); with jax's cuDNN probe stubbed to 9.8 the
  forward and backward lower to cuDNN's fused attention custom call for CUDA with the token mask."""
  _, tok = _tf_mask(3, 2, 26)  # 78 tokens
  x = jax.ShapeDtypeStruct((2, tok.shape[-1], 2, 128), jnp.bfloat16)
  m = jax.ShapeDtypeStruct(tok.shape, jnp.bool_)

  def loss(q, k, v, m):
    return kernels.dot_product_attention(q, k, v, m, impl="cudnn").astype(jnp.float32).sum()

  def grads(q, k, v, m):
    return jax.grad(loss, (0, 1, 2))(q, k, v, m)

  with pytest.raises(ValueError, match="attention_impl='cudnn' needs a CUDA GPU with cuDNN: cuDNN is not detected"):
    _cuda_export(grads, x, x, x, m)
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 90800)
  text = _cuda_export(grads, x, x, x, m)
  assert all(f"@{t}(" in text for t in CUDNN_CALLS)


def test_cudnn_pads_odd_lengths_exactly(monkeypatch):
  """cuDNN trains a masked attention on even lengths only: odd ones are padded (``pad_to_even``). The padded
  problem, sliced, equals the unpadded one in values and gradients (checked with the reference), and an odd
  length lowers to cuDNN's custom call."""
  _, tok = _tf_mask(3, 2, 25)  # 75 tokens
  q, k, v = _qkv(2, 75, 2, 8)
  k, v = k[:, :-2], v[:, :-2]  # Lk = 73: both odd
  m = jnp.asarray(tok)[:, :, :73].repeat(2, 0)[:, None]

  def padded(q, k, v):
    qp, kp, vp, mp = attn_ref.pad_to_even(q, k, v, m)
    assert qp.shape[1] % 2 == 0 and kp.shape[1] % 2 == 0
    return attn_ref.dot_product_attention(qp, kp, vp, mp)[:, :q.shape[1]]

  plain = lambda q, k, v: attn_ref.dot_product_attention(q, k, v, m)  # pylint: disable=unnecessary-lambda-assignment
  np.testing.assert_allclose(padded(q, k, v), plain(q, k, v), atol=1e-6)
  cot = jax.random.normal(jax.random.key(9), q.shape)
  g_pad = jax.grad(lambda *a: (padded(*a) * cot).sum(), (0, 1, 2))(q, k, v)
  g_ref = jax.grad(lambda *a: (plain(*a) * cot).sum(), (0, 1, 2))(q, k, v)
  for a, b in zip(g_pad, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 90800)
  x = jax.ShapeDtypeStruct((2, 75, 2, 128), jnp.bfloat16)
  loss = lambda q, k, v, m: kernels.dot_product_attention(q, k, v, m, impl="cudnn").astype(jnp.float32).sum()  # pylint: disable=unnecessary-lambda-assignment
  text = _cuda_export(jax.grad(loss, (0, 1, 2)), x, x, x, jax.ShapeDtypeStruct(tok.shape, jnp.bool_))
  assert all(f"@{t}(" in text for t in CUDNN_CALLS)


def test_xla_attention_lowers_for_cuda():
  """The ``implementation=None`` (XLA) path of ``jax.nn.dot_product_attention`` with the token mask, and
  the reference, lower for CUDA here (no GPU needed)."""
  _, tok = _tf_mask(3, 2, 26)
  x = jax.ShapeDtypeStruct((2, tok.shape[-1], 2, 128), jnp.bfloat16)
  m = jax.ShapeDtypeStruct(tok.shape, jnp.bool_)

  def nn_xla(q, k, v, m):
    return jax.nn.dot_product_attention(q, k, v, mask=m[:, None], implementation=None)

  for fn in (nn_xla, lambda q, k, v, m: kernels.dot_product_attention(q, k, v, m, impl="xla")):
    text = _cuda_export(lambda *a, fn=fn: jax.grad(lambda q: fn(q, *a[1:]).astype(jnp.float32).sum())(a[0]),
                        x, x, x, m)
    assert "stablehlo.dot_general" in text and "cudnn" not in text


def test_impls_are_checked_and_never_fall_back():
  q, k, v = _qkv(1, 8, 1, 8)
  with pytest.raises(ValueError, match=r"model.attention_impl='flash': must be one of \('xla', 'xla_lse', 'splash', 'cudnn'"):
    kernels.dot_product_attention(q, k, v, impl="flash")

  def splash(q, k, v):
    return kernels.dot_product_attention(q, k, v, impl="splash")

  assert jax.eval_shape(splash, q, k, v).shape == q.shape  # tracing anywhere is fine; lowering decides
  refused = r"model.attention_impl='splash' \(a TPU kernel; .*\) cannot be lowered for platform "
  with pytest.raises(ValueError, match=refused + "cpu"):
    jax.jit(jax.grad(lambda q: splash(q, k, v).sum()))(q)
  with pytest.raises(ValueError, match=refused + "cuda"):
    _cuda_export(splash, q, k, v)
  assert kernels.resolve_attention_impl("auto", (q.astype(jnp.bfloat16),)) == "xla_lse"  # CPU: cpu_flash is float32
  from conftest import tiny_config  # pylint: disable=g-import-not-at-top
  from jaxwm import config_checks  # pylint: disable=g-import-not-at-top
  c = tiny_config()
  c.model.attention_impl = "flash"
  with pytest.raises(config_checks.ConfigError, match="model.attention_impl='flash': must be one of 'xla', 'xla_lse', 'splash'"):
    config_checks.check_model(c)
  c.model.attention_impl = "splash"
  config_checks.check_model(c)  # viewrope: per-key transforms, kernels apply
  c.model.camera.update(encoding="worldrope", channels="hw")
  with pytest.raises(config_checks.ConfigError, match="its per-view attention has no splash or cuDNN form"):
    config_checks.check_model(c)


@pytest.mark.parametrize("kind,frames_,chunk,n", [("teacher_forcing", 5, 2, 37), ("diffusion_forcing", 7, 3, 29)])
def test_splash_with_a_static_frame_mask_matches_and_never_builds_the_token_mask(kind, frames_, chunk, n):
  """A layout's mask as :class:`StaticFrameMask` (what training passes without chunk drop or head windows):
  splash's blocks, computed on the host per block, equal the padded token mask; forward and gradients equal the
  reference; and the traced program holds nothing of the ``[Lq, Lk]`` token mask's size."""
  from jaxwm.training.layout import make_layout  # pylint: disable=g-import-not-at-top
  from pallas_kernels import splash_attention as spl  # pylint: disable=g-import-not-at-top
  frames = make_layout(kind, frames_, chunk).mask
  static = attn_ref.StaticFrameMask(frames, n)
  tok = np.asarray(expand_frame_mask(jnp.asarray(frames)[None], n))
  assert static.shape == tok.shape and np.array_equal(np.asarray(static.tokens()), tok)
  length = tok.shape[-1]
  padded = -(-length // 128) * 128
  lazy = spl.FrameTokenMask(frames, n, (padded, padded))
  want_padded = spl._pad_mask(tok[0], length, length, padded, padded, np)  # pylint: disable=protected-access
  for qs, ks in [(slice(0, 128), slice(128, 256)), (slice(128, padded), slice(0, padded)), (slice(None), slice(None))]:
    np.testing.assert_array_equal(lazy[qs, ks], want_padded[qs, ks])
  same = attn_ref.StaticFrameMask(frames.copy(), n)
  assert hash(same) == hash(static) and same == static
  assert static != attn_ref.StaticFrameMask(frames, n + 1)

  q, k, v = _qkv(2, length, 2, 16, seed=3)
  want = reference(q, k, v, jnp.asarray(tok))
  np.testing.assert_allclose(np.asarray(jax.jit(_splash(static))(q, k, v)), np.asarray(want), atol=2e-6)
  np.testing.assert_allclose(np.asarray(reference(q, k, v, static)), np.asarray(want), atol=1e-6)
  cot = jax.random.normal(jax.random.key(4), want.shape)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(_splash(static)(*a) * cot), (0, 1, 2)))(q, k, v)
  ref_grads = jax.grad(lambda *a: jnp.sum(reference(*a, jnp.asarray(tok)) * cot), (0, 1, 2))(q, k, v)
  for name, g, r in zip("qkv", grads, ref_grads):
    rel = float(jnp.abs(g - r).max() / jnp.abs(r).max())
    assert rel < 1e-5, (name, rel)

  # At a length where blocks repeat (21 frames of 96 tokens, 16 x 16 blocks), traced only: the static path keeps
  # its distinct partial blocks, the traced mask path every block of the padded [L, L] mask.
  big = make_layout(kind, 21, 5).mask
  q, k, v = (jax.ShapeDtypeStruct((1, big.shape[0] * 96, 2, 16), jnp.float32),) * 3
  def largest(mask):
    jaxpr = jax.make_jaxpr(_splash(mask))(q, k, v)
    sizes = [int(np.prod(x.aval.shape)) for e in jaxpr.eqns for x in (*e.invars, *e.outvars) if hasattr(x, "aval")]
    return max(sizes + [int(np.size(c)) for c in jaxpr.consts])
  lp = -(-q.shape[1] // 128) * 128
  tok_big = expand_frame_mask(jnp.asarray(big)[None], 96)
  assert largest(tok_big) >= lp * lp
  assert largest(attn_ref.StaticFrameMask(big, 96)) < lp * lp // 4


@pytest.mark.parametrize("n,heads,examples,block", [(37, 1, 1, 1024), (29, 2, 2, 1024), (128, 2, 1, 1024),
                                                     (150, 1, 2, 128)])
def test_splash_with_a_traced_frame_mask_matches_and_never_builds_the_token_mask(n, heads, examples, block,
                                                                                 monkeypatch):
  """A traced frame mask (:class:`FrameMask`: chunk drop and per-head windows make it random per step), shared,
  per head and per example, frames padded (37, 29, 150 tokens) or not (128), one or two blocks per frame: the
  block tables equal the padded token mask block by block; forward and gradients equal the reference; the
  traced program holds nothing of the ``[Lq, Lk]`` token mask's size."""
  from pallas_kernels import splash_attention as spl  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(n)
  frames = teacher_forcing_layout(5, 2).mask
  s = frames.shape[0]
  m = np.broadcast_to(frames, (examples, heads, s, s)) & (rng.random((examples, heads, s, s)) < 0.6)
  m |= np.eye(s, dtype=bool)  # every query frame keeps its own frame
  fm = attn_ref.FrameMask(jnp.asarray(m if heads > 1 else m[:, 0]), n)
  assert fm.shape == ((examples, heads) if heads > 1 else (examples,)) + (s * n, s * n)

  padded, blk = spl.frame_blocks(n, block)
  assert padded % 128 == 0 and padded % blk == 0 and padded - 128 < n <= padded and blk <= max(block, 128)
  # Block tables against the token mask of the per-frame padded sequence (padded keys masked).
  tok = np.asarray(expand_frame_mask(jnp.asarray(m[0]), padded))  # [H, S*padded, S*padded]
  tok = tok & np.tile(np.arange(padded) < n, s)[None, None, :]
  for dkv in (False, True):
    info = spl.frame_mask_info(jnp.asarray(m[0]), n, blk, padded, dkv=dkv)
    bm = np.asarray(info.block_mask)
    pattern = None if info.partial_mask_blocks is None else np.asarray(info.partial_mask_blocks)[0]
    for hh in range(heads):
      for i in range(bm.shape[1]):
        for j in range(bm.shape[2]):
          want_block = tok[hh, i * blk:(i + 1) * blk, j * blk:(j + 1) * blk]
          got = {0: np.zeros_like(want_block), 2: np.ones_like(want_block)}.get(int(bm[hh, i, j]))
          if got is None:
            got = pattern.T if dkv else pattern
          np.testing.assert_array_equal(got, want_block)
          if bm[hh, i, j]:  # a visible block is fetched where it is
            assert int(np.asarray(info.data_next)[hh, i, j]) == (i if dkv else j)

  q, k, v = _qkv(2, s * n, 2, 16, seed=n)
  want = reference(q, k, v, fm)
  np.testing.assert_allclose(np.asarray(reference(q, k, v, fm.tokens())), np.asarray(want), atol=1e-6)
  f = lambda q, k, v: kernels.dot_product_attention(q, k, v, fm, impl="splash", interpret=True, frame_block=block)  # pylint: disable=unnecessary-lambda-assignment
  np.testing.assert_allclose(np.asarray(jax.jit(f)(q, k, v)), np.asarray(want), atol=2e-6)
  cot = jax.random.normal(jax.random.key(4), want.shape)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) * cot), (0, 1, 2)))(q, k, v)
  ref_grads = jax.grad(lambda *a: jnp.sum(reference(*a, fm) * cot), (0, 1, 2))(q, k, v)
  for name, g, r in zip("qkv", grads, ref_grads):
    rel = float(jnp.abs(g - r).max() / jnp.abs(r).max())
    assert rel < 1e-5, (name, rel)
  if heads > 1:  # per-head tables in groups small enough for scalar memory: one head per call, same result
    monkeypatch.setattr(spl, "TABLE_BYTES", 3 * s * s)
    assert spl.heads_per_call(s, s, True) == 1
    np.testing.assert_allclose(np.asarray(jax.jit(f)(q, k, v)), np.asarray(want), atol=2e-6)
    with pytest.raises(ValueError, match="bytes per head"):
      spl.heads_per_call(s, s, True, budget=3 * s * s - 1)
    monkeypatch.undo()

  # At 21 frames of 96 tokens, traced only: nothing near the [L, L] token mask's size, forward or backward.
  big = teacher_forcing_layout(13, 2).mask
  sb = big.shape[0]
  big = jnp.asarray(np.broadcast_to(big, (examples, heads, sb, sb)))
  fm = attn_ref.FrameMask(big if heads > 1 else big[:, 0], 96)
  q, k, v = (jax.ShapeDtypeStruct((examples, sb * 96, heads, 16), jnp.float32),) * 3
  jaxpr = jax.make_jaxpr(jax.grad(lambda *a: jnp.sum(f(*a)), (0, 1, 2)))(q, k, v)
  sizes = [int(np.prod(x.aval.shape)) for e in jaxpr.eqns for x in (*e.invars, *e.outvars) if hasattr(x, "aval")]
  assert sb >= 21 and max(sizes + [int(np.size(c)) for c in jaxpr.consts]) < (sb * 96) ** 2 // 4


def test_model_with_splash_equals_xla():
  """The tiny model's teacher-forcing forward with ``attention_impl="splash"`` (interpreted) equals ``xla``."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import CameraConfig, ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.init import init_params  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  layout = teacher_forcing_layout(5, 2)
  s = layout.mask.shape[0]
  cfg = ModelConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=64, in_channels=12, out_channels=12,
                    camera=CameraConfig(encoding="rope3d"))
  shape = (1, s, 6, 6, 12)  # 9 tokens per frame
  x = jax.random.normal(jax.random.key(0), shape)
  frames = layout.frames(1)
  params = nn.unbox(init_params(WanModel(cfg), jax.random.key(1), shape, 24))
  outs = []
  for impl in ("xla", "splash"):
    model = WanModel(dataclasses.replace(cfg, attention_impl=impl,
                                         attention=dataclasses.replace(cfg.attention, interpret=True)))
    outs.append(jax.jit(lambda p, x, m=model: m.apply({"params": p}, x, jnp.zeros(shape[:2]), frames)[0])(params, x))
  np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(outs[0]), atol=1e-5)
  # The layout's own mask travels static (splash never builds the token mask); the same mask given as an
  # array (what chunk drop makes) takes the traced path: both equal.
  assert frames.static_mask is not None
  traced = layout.frames(1, mask=jnp.asarray(layout.mask)[None])
  assert traced.static_mask is None
  model = WanModel(dataclasses.replace(cfg, attention_impl="splash",
                                       attention=dataclasses.replace(cfg.attention, interpret=True)))
  out = jax.jit(lambda p, x: model.apply({"params": p}, x, jnp.zeros(shape[:2]), traced)[0])(params, x)
  np.testing.assert_allclose(np.asarray(out), np.asarray(outs[1]), atol=1e-5)
  # ReWorld's per-head windows (head 0 global, head 1 the last 2 frames), traced: splash equals xla.
  from jaxwm.training import augment  # pylint: disable=g-import-not-at-top
  windows = augment.head_window_mask(layout.mask, layout.frame_pos, layout.frame_pos, jnp.asarray([True, False]), 2)
  per_head = layout.frames(1, mask=windows[None])
  got = [jax.jit(lambda p, x, m=m: m.apply({"params": p}, x, jnp.zeros(shape[:2]), per_head)[0])(params, x)
         for m in (WanModel(dataclasses.replace(cfg, attention_impl="xla")), model)]
  np.testing.assert_allclose(np.asarray(got[1]), np.asarray(got[0]), atol=1e-5)
  assert float(jnp.abs(got[0] - out).max()) > 1e-3  # the windows changed the output
