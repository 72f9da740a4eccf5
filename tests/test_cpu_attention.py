"""``impl='cpu_flash'`` (``xla_kernels/cpu_attention.cc``, a C++ kernel for XLA:CPU built with g++) against
JAX differentiating the reference (``jaxwm.ops.attention``): values and gradients under every mask form it takes
(none, per example, shared, a per-head array of one head, static and traced frame masks), odd and unequal lengths
over its query blocks, a custom scale, a query with no key, NaN propagation, per batch shard on a device mesh, a
small ViewRope model's loss and gradients. WorldRoPE's per-view form (each query frame its own keys on the
view-dependent channels) the same way: against the reference's values and gradients over frames split across
query blocks, with and without shared channels, and a small WorldRoPE model's loss and gradients. And the refusals
(bfloat16, per-head masks, other platforms, per-view shapes that do not fit)."""

import functools
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import kernels
from jaxwm.ops import attention as attn_ref

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="cpu_flash builds its kernel with g++")

B, LQ, LK, H, D = 2, 77, 131, 3, 20  # 77 queries: one full block of 64 and a partial one


@pytest.fixture(autouse=True)
def _blocks_of_64(monkeypatch):
  """Units of 64 query rows (the kernel would take all 77 in one at these few keys): the tests cross blocks."""
  from xla_kernels import cpu_attention  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cpu_attention, "BLOCK", 64)


def _inputs(lq=LQ, lk=LK, seed=0, b=B):
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (b, lq, H, D))
  k = jax.random.normal(ks[1], (b, lk, H, D))
  v = jax.random.normal(ks[2], (b, lk, H, D))
  g = jax.random.normal(ks[3], (b, lq, H, D))
  return q, k, v, g


def _random_mask(shape, seed=1):
  m = np.random.default_rng(seed).random(shape) < 0.6
  m[..., 0] = True  # every query attends to a key
  return jnp.asarray(m)


def _value_and_grads(fn, q, k, v, g, mask):
  out, pull = jax.vjp(lambda q, k, v: fn(q, k, v, mask), q, k, v)
  return (out, *pull(g))


def _compare(q, k, v, g, mask, atol=2e-5, **kw):
  want = _value_and_grads(lambda q, k, v, m: attn_ref.dot_product_attention(q, k, v, m, **kw), q, k, v, g, mask)
  got = jax.jit(lambda q, k, v, g: _value_and_grads(
      lambda q, k, v, m: kernels.dot_product_attention(q, k, v, m, impl="cpu_flash", **kw), q, k, v, g, mask))(
          q, k, v, g)
  for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, err_msg=name)


MASKS = {"none": None, "per_example": _random_mask((B, LQ, LK)), "shared": _random_mask((1, LQ, LK), 2),
         "one_head": _random_mask((B, 1, LQ, LK), 3)}


@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
def test_dense_matches_the_reference_and_its_gradients(mask):
  _compare(*_inputs(), MASKS[mask])


@pytest.mark.parametrize("kind", ["static_frames", "traced_frames"])
def test_frame_masks_match(kind):
  frames = np.tril(np.ones((5, 5), bool))  # 5 frames of 19 tokens: causal over frames, 95 queries
  masks = {"static_frames": attn_ref.StaticFrameMask(frames, 19),
           "traced_frames": attn_ref.FrameMask(jnp.asarray(np.stack([frames, frames.T | np.eye(5, dtype=bool)])),
                                               19)}
  q, k, v, g = _inputs(lq=95, lk=95)
  _compare(q, k, v, g, masks[kind])


def test_scale_and_shapes_off_the_block():
  for lq, lk in ((1, 1), (64, 7), (65, 200), (130, 33)):
    q, k, v, g = _inputs(lq=lq, lk=lk, seed=lq)
    _compare(q, k, v, g, None, scale=0.3)


def test_a_nan_in_a_query_reaches_its_output_and_no_other():
  q, k, v, _ = _inputs()
  q = q.at[1, 5, 2, 3].set(jnp.nan)
  out = np.asarray(kernels.dot_product_attention(q, k, v, MASKS["per_example"], impl="cpu_flash"))
  assert np.isnan(out[1, 5, 2]).all()
  bad = np.zeros(out.shape, bool)
  bad[1, 5, 2] = True
  assert np.isfinite(out[~bad]).all()


def test_a_query_with_no_key_gets_zero_and_the_others_are_unchanged():
  """The docstring's promise for a fully masked row (the reference divides 0 by 0 there): output 0, no gradient
  through it, and every other row as the reference computes it."""
  q, k, v, g = _inputs()
  mask = np.asarray(MASKS["per_example"]).copy()
  mask[0, 3] = False

  def fn(q, k, v):
    return kernels.dot_product_attention(q, k, v, jnp.asarray(mask), impl="cpu_flash")

  out, pull = jax.vjp(fn, q, k, v)
  dq, dk, dv = pull(g)
  assert not np.asarray(out[0, 3]).any() and not np.asarray(dq[0, 3]).any()
  # The reference, with that row attending everywhere and no cotangent on it: the other rows and dk, dv unchanged.
  full = mask.copy()
  full[0, 3] = True
  g_masked = g.at[0, 3].set(0.0)
  want_out, want_pull = jax.vjp(lambda q, k, v: attn_ref.dot_product_attention(q, k, v, jnp.asarray(full)), q, k, v)
  keep = np.ones(out.shape, bool)
  keep[0, 3] = False
  np.testing.assert_allclose(np.asarray(out)[keep], np.asarray(want_out)[keep], atol=2e-5)
  for a, b in zip((dk, dv), want_pull(g_masked)[1:]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_no_keys_at_all_give_zero_outputs_and_gradients():
  """Zero keys (every row's sum is 0): outputs and the query's gradient 0 and finite, as the reference's."""
  q, _, _, g = _inputs()
  k = v = jnp.zeros((B, 0, H, D))
  for mask in (None, jnp.zeros((B, LQ, 0), bool)):
    out, pull = jax.vjp(lambda q: kernels.dot_product_attention(q, k, v, mask, impl="cpu_flash"), q)
    assert out.shape == (B, LQ, H, D) and not np.asarray(out).any()
    assert not np.asarray(pull(g)[0]).any()


def test_per_batch_shard_on_a_mesh_equals_one_device():
  q, k, v, g = _inputs(b=4)
  mask = _random_mask((4, LQ, LK), 7)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("data",))

  def run(q, k, v, g, mask):
    return _value_and_grads(lambda q, k, v, m: kernels.dot_product_attention(
        q, k, v, m, impl="cpu_flash", batch_axes=("data",)), q, k, v, g, mask)

  want = jax.jit(run)(q, k, v, g, mask)
  with jax.set_mesh(mesh):
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    args = [jax.device_put(a, sharded) for a in (q, k, v, g, mask)]
    assert "shard_map" in str(jax.make_jaxpr(run)(*args))
    got = jax.jit(run)(*args)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_refusals_name_the_impl():
  q, k, v, _ = _inputs()
  with pytest.raises(ValueError, match="model.attention_impl='cpu_flash': is float32 only; q is bfloat16"):
    kernels.dot_product_attention(q.astype(jnp.bfloat16), k, v, impl="cpu_flash")
  with pytest.raises(ValueError, match="model.attention_impl='cpu_flash': takes a mask shared by the heads"):
    kernels.dot_product_attention(q, k, v, _random_mask((B, H, LQ, LK)), impl="cpu_flash")
  from jax import export  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"'cpu_flash' \(a CPU kernel; .*\) cannot be lowered for platform cuda"):
    export.export(jax.jit(lambda q, k, v: kernels.dot_product_attention(q, k, v, impl="cpu_flash")),
                  platforms=["cuda"])(q, k, v)
  q, k, v, fac, _ = _per_view_inputs(3, 5, 7, 8, (1, 2))
  with pytest.raises(ValueError, match=r"model.attention_impl='cpu_flash': per-view shapes .* are not \[B, F N"):
    kernels.per_view_attention(q, k, v, fac[:, :, 1:], (1, 2), scale=1.0, impl="cpu_flash")
  with pytest.raises(ValueError, match=r"model.attention_impl='cpu_flash': pairs \(1, 4\) must be distinct channel "
                                       r"pairs of head_dim 8 \(0 <= pair < 4\)"):
    kernels.per_view_attention(q, k, v, fac, (1, 4), scale=1.0, impl="cpu_flash")
  with pytest.raises(ValueError, match="model.attention_impl='cpu_flash': is float32 only; factors is bfloat16"):
    kernels.per_view_attention(q, k, v, fac.astype(jnp.bfloat16), (1, 2), scale=1.0, impl="cpu_flash")
  with pytest.raises(ValueError, match=r"'cpu_flash' \(a CPU kernel; .*\) cannot be lowered for platform cuda"):
    export.export(jax.jit(lambda *a: kernels.per_view_attention(*a, (1, 2), scale=1.0, impl="cpu_flash")),
                  platforms=["cuda"])(q, k, v, fac)


def _per_view_inputs(f, n, lk, d, pairs, dv=None, seed=0, b=B):
  ks = jax.random.split(jax.random.key(seed), 5)
  q = jax.random.normal(ks[0], (b, f * n, H, d))
  k = jax.random.normal(ks[1], (b, lk, H, d))
  v = jax.random.normal(ks[2], (b, lk, H, dv or d))
  fac = jax.random.normal(ks[3], (b, f, lk, len(pairs), 2))
  g = jax.random.normal(ks[4], (b, f * n, H, dv or d))
  return q, k, v, fac, g


@pytest.mark.parametrize("f,n,lk,d,pairs,dv,mask", [
    (3, 77, 131, 20, (1, 4, 7), None, "per_example"),  # scattered pairs; each frame one full block and a partial one
    (4, 19, 53, 6, (0, 1, 2), 9, "shared"),  # every channel rotated; values of another width
    (1, 130, 33, 8, (3,), None, None),  # one view
    (2, 33, 40, 22, tuple(range(2, 9)), None, "shared"),  # consecutive pairs, channels on both sides
    (5, 1, 1, 4, (1, 0), 3, None),  # one query per frame, one key; pairs out of order
])
def test_per_view_matches_the_reference_and_its_gradients(f, n, lk, d, pairs, dv, mask):
  args = _per_view_inputs(f, n, lk, d, pairs, dv, seed=f * n)
  m = None if mask is None else _random_mask((B if mask == "per_example" else 1, f * n, lk), f)

  def run(impl, *a):
    out, pull = jax.vjp(lambda *x: kernels.per_view_attention(*x, pairs, m, scale=d**-0.5, impl=impl), *a[:-1])
    return (out, *pull(a[-1]))

  want, got = run("xla", *args), jax.jit(functools.partial(run, "cpu_flash"))(*args)
  for name, x, y in zip(("out", "dq", "dk", "dv", "dfactors"), got, want):
    assert x.dtype == y.dtype and x.shape == y.shape, name
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=3e-5, err_msg=name)


def test_per_view_per_batch_shard_on_a_mesh_equals_one_device():
  args = _per_view_inputs(3, 10, 29, 8, (0, 3), b=4)
  mask = _random_mask((4, 30, 29), 8)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("data",))

  def run(q, k, v, fac, g, mask):
    out, pull = jax.vjp(lambda *x: kernels.per_view_attention(*x, (0, 3), mask, scale=0.25, impl="cpu_flash",
                                                              batch_axes=("data",)), q, k, v, fac)
    return (out, *pull(g))

  want = jax.jit(run)(*args, mask)
  with jax.set_mesh(mesh):
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    placed = [jax.device_put(a, sharded) for a in (*args, mask)]
    assert "shard_map" in str(jax.make_jaxpr(run)(*placed))
    got = jax.jit(run)(*placed)
  for x, y in zip(got, want):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_auto_picks_cpu_flash_on_cpu_where_it_applies(tmp_path, monkeypatch, caplog):
  """``model.attention_impl="auto"`` (the default) on CPU: ``cpu_flash`` for float32 inputs and masks shared by the
  heads (arrays, broadcast ones, frame masks), dense or per view; ``xla_lse`` for another dtype in any input, a
  per-head mask, or a kernel that cannot be built here (a warning says why; nothing raises). Under an abstract TPU
  mesh: splash, and ``xla_lse`` per view."""
  FrameMask, StaticFrameMask = attn_ref.FrameMask, attn_ref.StaticFrameMask  # pylint: disable=invalid-name
  resolve = kernels.resolve_attention_impl
  q, k, v, _ = _inputs(lq=40, lk=40)
  frames = np.tril(np.ones((5, 5), bool))
  assert resolve("auto", (q, k, v)) == "cpu_flash"
  assert resolve("auto", (q, k, v), MASKS["one_head"][..., :40, :40], per_view=True) == "cpu_flash"
  assert resolve("auto", (q, k, v), jnp.ones((B, 1, 40), bool)) == "cpu_flash"
  assert resolve("auto", (q, k, v), StaticFrameMask(frames, 8)) == "cpu_flash"
  assert resolve("auto", (q, k, v), FrameMask(jnp.asarray(np.stack([frames] * B))[:, None], 8)) == "cpu_flash"
  assert resolve("auto", (q, k.astype(jnp.bfloat16), v)) == "xla_lse"
  assert resolve("auto", (q, k, v), _random_mask((B, H, 40, 40))) == "xla_lse"
  assert resolve("auto", (q, k, v), FrameMask(jnp.ones((B, H, 5, 5), bool), 8)) == "xla_lse"
  assert resolve("cpu_flash", (q.astype(jnp.bfloat16),)) == "cpu_flash"  # asked for: refused later, by name
  # a broadcast mask through auto, end to end
  m = _random_mask((B, 1, 40), 4)
  np.testing.assert_allclose(np.asarray(kernels.dot_product_attention(q, k, v, m, impl="auto")),
                             np.asarray(attn_ref.dot_product_attention(q, k, v, m)), atol=2e-5)
  # no kernel here: a compiler that is not there, an empty cache, nothing loaded yet
  from xla_kernels import cpu_attention  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cpu_attention, "_loaded", [])
  monkeypatch.setattr(cpu_attention, "_unavailable", [])
  monkeypatch.setenv("CXX", "no-such-compiler")
  monkeypatch.setenv("JAXWM_KERNEL_CACHE", str(tmp_path))
  with caplog.at_level("WARNING"):
    assert resolve("auto", (q, k, v)) == "xla_lse"
    assert resolve("auto", (q, k, v)) == "xla_lse"  # found once
  assert sum("cpu_flash kernel is unavailable here" in r.message and "g++ (or $CXX)" in r.message
             for r in caplog.records) == 1
  monkeypatch.undo()
  from jaxwm.training.compile_only import topology_devices  # pylint: disable=g-import-not-at-top
  try:
    devices = topology_devices("v5p:2x2x1")
  except ValueError as e:  # no libtpu here
    pytest.skip(str(e))
  with jax.set_mesh(jax.sharding.Mesh(np.asarray(devices).reshape(-1), ("data",))):
    assert resolve("auto", (q, k, v)) == "splash"
    assert resolve("auto", (q, k, v), per_view=True) == "xla_lse"


def test_many_threads_give_the_same_values(monkeypatch):
  """The units split over 3 OpenMP threads (races between units, the per-thread key buffers, the factor gradient's
  sum over heads after the barrier) give what one thread gives, dense and per view."""
  from xla_kernels import cpu_attention  # pylint: disable=g-import-not-at-top
  q, k, v, fac, g = _per_view_inputs(3, 70, 45, 8, (0, 2), b=3)
  mask = _random_mask((3, 210, 45), 9)

  results = []
  for n in (1, 3):
    monkeypatch.setattr(cpu_attention, "threads", lambda n=n: n)

    def run(*a):  # a new function per thread count: traced again, with this count
      out, pull = jax.vjp(lambda *x: kernels.per_view_attention(*x, (0, 2), mask, scale=0.3, impl="cpu_flash"), *a)
      dense, pull_dense = jax.vjp(lambda *x: kernels.dot_product_attention(*x, mask, impl="cpu_flash"), *a[:3])
      return (out, *pull(g), dense, *pull_dense(g))

    assert f"threads = {n} : i64" in jax.jit(run).lower(q, k, v, fac).as_text()
    results.append(jax.jit(run)(q, k, v, fac))
  for x, y in zip(*results):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_per_view_edge_rows_and_vmap():
  """Per view: a query with no key gets 0 and passes no gradient; a NaN in a masked-out key changes nothing
  (the reference masks it with -inf); a NaN in a kept key reaches its queries; a mask broadcast over the queries
  and a mask of floats read as the reference reads them; under ``vmap`` (one call per element) the values are those
  of each element alone."""
  q, k, v, fac, g = _per_view_inputs(2, 9, 13, 8, (1, 3), b=2)
  mask = np.asarray(_random_mask((2, 18, 13), 3)).copy()
  mask[1, 4] = False
  mask[:, :, 5] = False  # key 5: masked out for every query

  def run(impl, k):
    return jax.vjp(lambda *x: kernels.per_view_attention(*x, (1, 3), jnp.asarray(mask), scale=0.3, impl=impl),
                   q, k, v, fac)

  out, pull = run("cpu_flash", k)
  dq = pull(g)[0]
  assert not np.asarray(out[1, 4]).any() and not np.asarray(dq[1, 4]).any()
  k_nan = k.at[:, 5].set(jnp.nan)
  got, want = run("cpu_flash", k_nan)[0], run("xla", k_nan)[0]
  keep = np.ones(got.shape, bool)
  keep[1, 4] = False  # the reference gives NaN where no key is kept
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(np.asarray(got)[keep], np.asarray(want)[keep], atol=2e-5)
  mask[:, :, 5] = True
  assert np.isnan(np.asarray(run("cpu_flash", k_nan)[0])[0, 0]).all()
  # a mask broadcast over the queries, and one of floats (nonzero: attend), as the reference reads them
  for m in (_random_mask((2, 1, 13), 5), jnp.where(_random_mask((2, 18, 13), 6), 0.5, 0.0).at[..., 0].set(2.0)):
    got, want = (kernels.per_view_attention(q, k, v, fac, (1, 3), m, scale=0.3, impl=i) for i in ("cpu_flash", "xla"))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
  per = lambda q, k, v, fac: kernels.per_view_attention(q, k, v, fac, (1, 3), scale=0.3, impl="cpu_flash")  # pylint: disable=unnecessary-lambda-assignment
  stacked = jax.vmap(per)(*(jnp.stack([a, a * 0.5]) for a in (q, k, v, fac)))
  for i, s in enumerate((1.0, 0.5)):
    np.testing.assert_allclose(np.asarray(stacked[i]), np.asarray(per(q * s, k * s, v * s, fac * s)), atol=1e-6)


def test_small_worldrope_model_loss_and_gradients_match():
  """A teacher-forcing step's loss and parameter gradients of a small WorldRoPE model (per-view attention under the
  chunk-causal frame mask; gradients reach the depth heads through the per-view keys): ``cpu_flash`` equals
  ``xla``."""
  from test_xla_kernels import assert_same_loss_and_grads, model_loss_and_grads  # pylint: disable=g-import-not-at-top
  want, got = model_loss_and_grads(("xla", "cpu_flash"), "worldrope", "hw", dim=96, num_layers=2)
  assert_same_loss_and_grads(got, want)


def test_small_viewrope_model_loss_and_gradients_match():
  """A teacher-forcing step's loss and parameter gradients of a small ViewRope model (dense attention under the
  chunk-causal frame mask): ``cpu_flash`` equals ``xla``."""
  from test_xla_kernels import assert_same_loss_and_grads, model_loss_and_grads  # pylint: disable=g-import-not-at-top
  want, got = model_loss_and_grads(("xla", "cpu_flash"), "viewrope", "t_low", dim=96, num_layers=2)
  assert_same_loss_and_grads(got, want)


def test_block_rows_sized_by_the_keys_give_the_same_attention(monkeypatch):
  """``block_rows``: powers of two in [64, 256] whose scores fit 1 MiB (256 rows at 960 keys, 64 from 4,096 on);
  with the blocks it picks (600 queries: 256, 256 and a partial 88) the kernel equals the reference, as with 64."""
  from xla_kernels import cpu_attention  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cpu_attention, "BLOCK", None)
  assert [cpu_attention.block_rows(n) for n in (1, 131, 960, 1024, 1100, 2048, 4096, 10**6)] == \
      [256, 256, 256, 256, 128, 128, 64, 64]
  q, k, v, g = _inputs(lq=600, lk=131, seed=4)

  def grads(block, impl="cpu_flash"):
    monkeypatch.setattr(cpu_attention, "BLOCK", block)
    f = lambda q, k, v: jnp.sum(kernels.dot_product_attention(q, k, v, impl=impl) * g)  # noqa: E731
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v)

  want_l, want_g = grads(None, "xla")
  for got_l, got_g in (grads(None), grads(64)):
    np.testing.assert_allclose(got_l, want_l, rtol=1e-5)
    for a, b in zip(got_g, want_g):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [2, 3])
def test_threads_give_the_same_bits(threads, monkeypatch):
  """Dense and per-view attention, values and gradients, on 2 or 3 OpenMP threads against 1 (the suite's fake
  devices leave each call one thread): the same bits, whatever order the dynamically handed-out units run in."""
  from xla_kernels import cpu_attention  # pylint: disable=g-import-not-at-top
  q, k, v, g = _inputs(lq=150, lk=131, seed=5)
  fac = jax.random.normal(jax.random.key(9), (B, 3, 131, 2, 2))

  def run(n):
    monkeypatch.setattr(cpu_attention, "threads", lambda: n)
    dense = lambda q, k, v: jnp.sum(kernels.dot_product_attention(q, k, v, impl="cpu_flash") * g)  # noqa: E731
    view = lambda q, k, v, f: jnp.sum(  # noqa: E731
        kernels.per_view_attention(q, k, v, f, (1, 3), scale=0.3, impl="cpu_flash") * g)
    return (jax.jit(jax.value_and_grad(dense, argnums=(0, 1, 2)))(q, k, v),
            jax.jit(jax.value_and_grad(view, argnums=(0, 1, 2, 3)))(q, k, v, fac))

  for a, b in zip(jax.tree.leaves(run(threads)), jax.tree.leaves(run(1))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
