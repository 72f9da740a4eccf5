"""The delta rule's C++ kernel for XLA:CPU (``xla_kernels.cpu_delta_rule``, ``model.loci.impl='cpu_flash'``): outputs,
final states and every gradient against the token-by-token recurrence in float64, over gates, chunk sizes, ragged
lengths and odd channel counts; strong decays; dtypes; the dispatch (mesh, vmap, other platforms refused); LOCI's
write through it; and one forward kernel per compiled gradient. fla parity: ``tests/test_delta_rule.py``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import kernels
from jaxwm.models.transformer import dots_and_kernels_saveable
from jaxwm.ops import delta_rule as dr
from xla_kernels import cpu_delta_rule

pytestmark = pytest.mark.skipif(cpu_delta_rule.unavailable() is not None, reason="no C++ compiler here")


def _inputs(seed, gate="kda", t=37, b=2, h=2, dk=12, dv=7, decay=1.0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, h, dk))
  k = rng.normal(size=(b, t, h, dk))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.normal(size=(b, t, h, dv))
  g = -decay * np.exp(rng.normal(size=(b, t, h, dk) if gate == "kda" else (b, t, h)) - 1.0)
  beta = rng.uniform(0.02, 1.98, size=(b, t, h))
  s0 = rng.normal(size=(b, h, dk, dv))
  return [x.astype(np.float32) for x in (q, k, v, g, beta, s0)]


def _weights(arrays):
  rng = np.random.default_rng(7)
  q, v, s0 = arrays[0], arrays[2], arrays[5]
  return rng.normal(size=q.shape[:3] + v.shape[-1:]), rng.normal(size=s0.shape)


def _run(fn, arrays, use_s0, dtype):
  wo, ws = (jnp.asarray(w, dtype) for w in _weights(arrays))

  def loss(q, k, v, g, beta, s0):
    o, s = fn(q, k, v, g, beta, initial_state=s0 if use_s0 else None, output_final_state=True)
    return jnp.sum(o * wo) + jnp.sum(s * ws), (o, s)

  grad = jax.grad(loss, argnums=tuple(range(6)), has_aux=True)
  grads, (o, s) = jax.jit(grad)(*(jnp.asarray(a, dtype) for a in arrays))
  return [np.asarray(x, np.float64) for x in (o, s, *grads)]


def _exact(arrays, use_s0):
  with jax.enable_x64():
    return _run(dr.delta_rule_recurrent, arrays, use_s0, jnp.float64)


def _kernel(chunk):
  return lambda *a, **kw: kernels.delta_rule_chunked(*a, chunk_size=chunk, impl="cpu_flash", **kw)


NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state")


def _check(got, want, ref32, names=NAMES):
  """Per entry, the kernel's error against float64 within 4x the float32 reference's own (plus a floor)."""
  for name, a, b, r in zip(names, got, want, ref32):
    scale = np.abs(b).max() + 1e-30
    err, err32 = np.abs(a - b).max() / scale, np.abs(r - b).max() / scale
    assert err <= 4 * err32 + 2e-6, (name, err, err32)


@pytest.mark.parametrize("gate", ["kda", "gdn"])
@pytest.mark.parametrize("chunk,t", [(16, 37), (5, 37), (1, 6), (64, 37), (16, 48)])
def test_values_and_gradients_against_the_recurrence_in_float64(gate, chunk, t):
  arrays = _inputs(chunk + t, gate, t=t)
  want = _exact(arrays, True)
  ref32 = _run(lambda *a, **kw: dr.delta_rule_chunked(*a, chunk_size=chunk, **kw), arrays, True, jnp.float32)
  _check(_run(_kernel(chunk), arrays, True, jnp.float32), want, ref32)


def test_without_an_initial_state_and_with_a_scale():
  arrays = _inputs(3, t=20, b=1, h=3, dk=16, dv=16)
  with jax.enable_x64():
    want = _run(lambda *a, **kw: dr.delta_rule_recurrent(*a, scale=0.3, **kw), arrays, False, jnp.float64)
  ref32 = _run(lambda *a, **kw: dr.delta_rule_chunked(*a, scale=0.3, chunk_size=8, **kw), arrays, False, jnp.float32)
  got = _run(lambda *a, **kw: kernels.delta_rule_chunked(*a, scale=0.3, chunk_size=8, impl="cpu_flash", **kw),
             arrays, False, jnp.float32)
  _check(got[:-1], want[:-1], ref32[:-1])  # no initial state given: its gradient is not taken


def test_a_traced_scale_is_differentiated():
  """A scale that is an array (here traced, as a learnt one would be): JAX scales q, and d scale is the reference's."""
  q, k, v, g, beta, s0 = (jnp.asarray(a) for a in _inputs(12, t=19, b=1, h=2, dk=8, dv=8))

  def loss(scale, impl):
    o, s = kernels.delta_rule_chunked(q, k, v, g, beta, scale=scale, initial_state=s0, chunk_size=8, impl=impl,
                                      output_final_state=True)
    return jnp.sum(o ** 2) + jnp.sum(s)

  got, want = (jax.jit(jax.value_and_grad(lambda c, i=i: loss(c, i)))(jnp.float32(0.4)) for i in ("cpu_flash", "xla"))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_threads_give_the_same_bits(threads, monkeypatch):
  """9 (batch, head) units on 1, 2 or 5 OpenMP threads (the suite's fake devices leave each call one thread): the same
  bits, and the reference's values at head dims 32 and 48 over 5 chunks."""
  arrays = _inputs(13, t=70, b=3, h=3, dk=32, dv=48)
  monkeypatch.setattr(cpu_delta_rule, "threads", lambda: threads)
  got = _run(_kernel(16), arrays, True, jnp.float32)
  monkeypatch.setattr(cpu_delta_rule, "threads", lambda: 1)
  one = _run(_kernel(16), arrays, True, jnp.float32)
  for a, b in zip(got, one):
    np.testing.assert_array_equal(a, b)
  ref32 = _run(lambda *a, **kw: dr.delta_rule_chunked(*a, chunk_size=16, **kw), arrays, True, jnp.float32)
  _check(got, _exact(arrays, True), ref32)


def test_nan_in_a_decay_reaches_the_outputs():
  """A NaN log-decay in token 10 (chunk 8): every output from its chunk on is NaN (within the chunk through the
  products, as in the reference), the first chunk's are not, and the state is."""
  q, k, v, g, beta, s0 = _inputs(14, t=20, b=1, h=1, dk=8, dv=8)
  g[0, 10, 0, :3] = np.nan
  o, s = (np.asarray(x) for x in kernels.delta_rule_chunked(q, k, v, g, beta, initial_state=s0, chunk_size=8,
                                                             impl="cpu_flash", output_final_state=True))
  assert np.isnan(o[0, 8:]).any(axis=-1).all() and np.isnan(s).any() and np.isfinite(o[0, :8]).all()


@pytest.mark.parametrize("decay", [30.0, 1e4])
def test_strong_decays_stay_finite_and_exact(decay):
  """Per-token decays of about exp(-30) and exp(-4000) (0 in float32): only exponentials of non-positive numbers
  are taken."""
  arrays = _inputs(11, t=24, b=1, h=1, dk=8, dv=8, decay=decay)
  o, s, *grads = _run(_kernel(8), arrays, True, jnp.float32)
  want = _exact(arrays, True) if decay < 100 else None
  assert np.isfinite(o).all() and np.isfinite(s).all() and all(np.isfinite(x).all() for x in grads)
  if want is not None:
    np.testing.assert_allclose(o, want[0], rtol=0, atol=1e-5 * np.abs(want[0]).max())
    for a, b in zip(grads, want[2:]):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
  else:  # nothing survives a token: o_t = beta_t (q_t . k_t) v_t, the last token's write is the state
    q, k, v, _, beta, _ = (np.asarray(x, np.float64) for x in arrays)
    qs = q * q.shape[-1] ** -0.5
    np.testing.assert_allclose(o, np.einsum("bthk,bthk,bth,bthv->bthv", qs, k, beta, v), atol=1e-5)
    np.testing.assert_allclose(s[0, 0], beta[0, -1, 0] * np.outer(k[0, -1, 0], v[0, -1, 0]), atol=1e-5)


def test_other_dtypes_are_cast_and_come_back():
  arrays = _inputs(2, t=16, b=1, h=2, dk=8, dv=8)
  x = [jnp.asarray(a, jnp.bfloat16) for a in arrays]
  o, s = kernels.delta_rule_chunked(*x[:5], initial_state=x[5], chunk_size=8, impl="cpu_flash",
                                    output_final_state=True)
  o_r, s_r = dr.delta_rule_chunked(*x[:5], initial_state=x[5], chunk_size=8, output_final_state=True)
  assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(o_r, np.float32), atol=2e-2)
  np.testing.assert_allclose(np.asarray(s), np.asarray(s_r), atol=1e-5)
  assert kernels.delta_rule_chunked(*x[:5], impl="cpu_flash")[1] is None


def test_mesh_vmap_and_other_platforms():
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxwm.training.sharding import make_mesh  # pylint: disable=g-import-not-at-top
  arrays = [jnp.asarray(a) for a in _inputs(4, "gdn", t=21, b=4, h=2, dk=8, dv=6)]
  want = dr.delta_rule_chunked(*arrays[:5], initial_state=arrays[5], chunk_size=8, output_final_state=True)
  mesh = make_mesh(2, 2, jax.devices()[:4])
  axes = ("data", "fsdp")
  with jax.set_mesh(mesh):
    put = lambda x: jax.device_put(x, NamedSharding(mesh, P(axes)))  # pylint: disable=unnecessary-lambda-assignment
    fn = jax.jit(lambda *a: kernels.delta_rule_chunked(*a[:5], initial_state=a[5], chunk_size=8, impl="cpu_flash",
                                                       output_final_state=True, batch_axes=axes))
    assert "shard_map" in str(jax.make_jaxpr(fn)(*arrays))
    got = fn(*map(put, arrays))
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a)[0] ** 2), argnums=tuple(range(6))))(*map(put, arrays))
  ref = jax.grad(lambda *a: jnp.sum(dr.delta_rule_chunked(*a[:5], initial_state=a[5], chunk_size=8)[0] ** 2),
                 argnums=tuple(range(6)))(*arrays)
  for a, b in zip(grads, ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4 * float(jnp.abs(b).max()))
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
  per = jax.vmap(lambda *a: kernels.delta_rule_chunked(*a, chunk_size=8, impl="cpu_flash")[0])(
      *(x[:, None] for x in arrays[:5]))
  np.testing.assert_allclose(np.asarray(per[:, 0]), np.asarray(dr.delta_rule_chunked(*arrays[:5], chunk_size=8)[0]),
                             atol=2e-5)
  for platform in ("cuda", "tpu"):
    with pytest.raises(ValueError, match=f"model.loci.impl='cpu_flash'.*cannot be lowered for platform {platform}"):
      jax.jit(lambda *a: kernels.delta_rule_chunked(*a, impl="cpu_flash")[0]).trace(*arrays[:5]).lower(
          lowering_platforms=(platform,))
  for bad in (0, True, 2.0):
    with pytest.raises(ValueError, match=rf"model.loci.impl='cpu_flash' \(the delta rule\): chunk_size={bad!r}"):
      kernels.delta_rule_chunked(*arrays[:5], chunk_size=bad, impl="cpu_flash")
  np.testing.assert_allclose(  # an int-like chunk (NumPy's) is a chunk
      np.asarray(kernels.delta_rule_chunked(*arrays[:5], initial_state=arrays[5], chunk_size=np.int64(8),
                                            impl="cpu_flash")[0]),
      np.asarray(want[0]), atol=2e-5)


def test_loci_write_through_the_kernel():
  _, k, v, _, beta, s0 = (jnp.asarray(a) for a in _inputs(6, t=19, b=1, h=2, dk=8, dv=8))
  got = kernels.delta_rule_write(k, v, beta, initial_state=s0, chunk_size=8, impl="cpu_flash")
  want = dr.delta_rule_write(k, v, beta, initial_state=s0, chunk_size=8)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_one_forward_and_one_backward_kernel_per_compiled_gradient():
  """The gradient saves the chunk states in the forward kernel and never runs it again, under the model's remat
  policy too."""
  arrays = [jnp.asarray(a) for a in _inputs(8, t=16, b=1, h=1, dk=8, dv=8)]
  fn = lambda *a: kernels.delta_rule_chunked(*a[:5], initial_state=a[5], chunk_size=8, impl="cpu_flash")[0].sum()
  for f in (fn, jax.checkpoint(fn, policy=dots_and_kernels_saveable)):  # model.remat="dots_and_kernels"
    text = jax.jit(jax.grad(f, argnums=tuple(range(6)))).lower(*arrays).compile().as_text()
    assert text.count('custom_call_target="jaxwm_cpu_delta_rule_fwd"') == 1
    assert text.count('custom_call_target="jaxwm_cpu_delta_rule_bwd"') == 1
  text = jax.jit(fn).lower(*arrays).compile().as_text()
  assert "f32[1,1,0,8,8]" in text  # without a gradient no state is saved


def test_no_tokens_pass_the_state_through():
  *xs, s0 = (jnp.asarray(a) for a in _inputs(9, t=37))
  q, k, v, g, beta = (x[:, :0] for x in xs)  # T = 0
  fn = lambda s0: kernels.delta_rule_chunked(q, k, v, g, beta, initial_state=s0, chunk_size=16, impl="cpu_flash",
                                             output_final_state=True)  # noqa: E731
  o, s = jax.jit(fn)(s0)
  assert o.shape == (2, 0, 2, 7)
  np.testing.assert_array_equal(np.asarray(s), np.asarray(s0))
  ds = jax.jit(jax.grad(lambda s0: jnp.sum(fn(s0)[1] * 2.0)))(s0)
  np.testing.assert_array_equal(np.asarray(ds), 2.0)
