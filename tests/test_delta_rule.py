"""Delta rule (docs/design.md §7): parity of outputs, final states and every gradient with fla's PyTorch
``naive.py`` references (loaded by file path: no triton needed), for the references and the C++ kernel
(``impl="cpu_flash"``); chunked == recurrent, safety under strong decay, LOCI's chunk-before-write against a
hand-written loop, LOCI's write alone against the recurrence with zero queries and decays."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import kernels
from jaxwm.ops import delta_rule as dr

torch = pytest.importorskip("torch")


def _load(rel, name):
  spec = importlib.util.find_spec("fla")
  path = pathlib.Path(spec.submodule_search_locations[0]) / rel
  mod_spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  return mod


@pytest.fixture(scope="module")
def fla_naive():
  return {"kda": _load("ops/kda/naive.py", "fla_kda_naive"),
          "gdn": _load("ops/gated_delta_rule/naive.py", "fla_gdn_naive")}


def _inputs(seed, gate, t=37, b=2, h=2, dk=16, dv=8):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, h, dk))
  k = rng.normal(size=(b, t, h, dk))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)  # fla's tests normalise q/k before calling
  q /= np.linalg.norm(q, axis=-1, keepdims=True)
  v = rng.normal(size=(b, t, h, dv))
  g_shape = (b, t, h, dk) if gate == "kda" else (b, t, h)
  g = -np.exp(rng.normal(size=g_shape) - 1.0)
  beta = rng.uniform(0.02, 1.98, size=(b, t, h))  # anywhere in (0, 2)
  s0 = rng.normal(size=(b, h, dk, dv))
  return [x.astype(np.float32) for x in (q, k, v, g, beta, s0)]


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _torch_run(fla_naive, gate, arrays, use_s0):
  q, k, v, g, beta, s0 = (torch.tensor(x, requires_grad=True) for x in arrays)
  if gate == "kda":
    o, s = fla_naive["kda"].naive_recurrent_kda(q, k, v, g, beta, initial_state=s0 if use_s0 else None,
                                                output_final_state=True)
  else:
    o, s = fla_naive["gdn"].naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=s0 if use_s0 else None,
                                                             output_final_state=True)
  wo, ws = _weights(arrays)
  ((o * torch.tensor(wo)).sum() + (s * torch.tensor(ws)).sum()).backward()
  grads = [x.grad.numpy() if x.grad is not None else np.zeros(x.shape, np.float32) for x in (q, k, v, g, beta, s0)]
  return o.detach().numpy(), s.detach().numpy(), grads


def _weights(arrays):
  rng = np.random.default_rng(99)
  q, v, s0 = arrays[0], arrays[2], arrays[5]
  return (rng.normal(size=q.shape[:3] + v.shape[-1:]).astype(np.float32), rng.normal(size=s0.shape).astype(np.float32))


def _jax_run(fn, arrays, use_s0):
  wo, ws = (jnp.asarray(w) for w in _weights(arrays))

  def loss(q, k, v, g, beta, s0):
    o, s = fn(q, k, v, g, beta, initial_state=s0 if use_s0 else None, output_final_state=True)
    return jnp.sum(o * wo) + jnp.sum(s * ws), (o, s)

  grads, (o, s) = jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))(*map(jnp.asarray, arrays))
  return o, s, grads


IMPLS = {"recurrent": dr.delta_rule_recurrent,
         "chunked16": lambda *a, **kw: dr.delta_rule_chunked(*a, chunk_size=16, **kw),
         "chunked64": lambda *a, **kw: dr.delta_rule_chunked(*a, chunk_size=64, **kw),
         "cpu_flash16": lambda *a, **kw: kernels.delta_rule_chunked(*a, chunk_size=16, impl="cpu_flash", **kw)}


def _impl_param(name):
  if name.startswith("cpu_flash"):
    from xla_kernels import cpu_delta_rule  # pylint: disable=g-import-not-at-top
    why = cpu_delta_rule.unavailable()
    return pytest.param(name, marks=pytest.mark.skipif(why is not None, reason=f"no C++ kernel here: {why}"))
  return name


@pytest.mark.parametrize("impl", [_impl_param(name) for name in IMPLS])
@pytest.mark.parametrize("gate", ["kda", "gdn"])
@pytest.mark.parametrize("use_s0", [True, False])
def test_parity_with_fla(fla_naive, impl, gate, use_s0):
  arrays = _inputs(0, gate)  # T = 37: not a multiple of either chunk size
  o_t, s_t, g_t = _torch_run(fla_naive, gate, arrays, use_s0)
  o_j, s_j, g_j = _jax_run(IMPLS[impl], arrays, use_s0)
  assert _rel(o_j, o_t) <= 1e-5
  assert _rel(s_j, s_t) <= 1e-5
  names = ["q", "k", "v", "g", "beta"] + (["initial_state"] if use_s0 else [])
  for name, a, b in zip(names, g_j, g_t):
    assert _rel(a, b) <= 1e-5, (name, _rel(a, b))


def test_final_state_only_when_asked():
  q, k, v, g, beta, _ = map(jnp.asarray, _inputs(1, "kda", t=8))
  for fn in (dr.delta_rule_recurrent, dr.delta_rule_chunked):
    assert fn(q, k, v, g, beta)[1] is None


@pytest.mark.parametrize("chunk", [16, 64])
def test_chunked_equals_recurrent_under_strong_decay(chunk):
  q, k, v, _, beta, s0 = map(jnp.asarray, _inputs(2, "kda", t=80))
  g = -30.0 * jnp.abs(jax.random.normal(jax.random.key(0), q.shape))  # exp(+|cumsum|) would overflow
  o_r, s_r = dr.delta_rule_recurrent(q, k, v, g, beta, initial_state=s0, output_final_state=True)
  o_c, s_c = dr.delta_rule_chunked(q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=chunk)
  assert _rel(o_c, o_r) <= 1e-5 and _rel(s_c, s_r) <= 1e-5
  grads = jax.grad(lambda *a: jnp.sum(dr.delta_rule_chunked(*a, chunk_size=chunk)[0] ** 2), argnums=(0, 1, 2, 3, 4))(
      q, k, v, g, beta)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in grads)


def test_chunk_before_write_equals_a_hand_written_loop():
  q, k, v, g, beta, s0 = _inputs(3, "kda", t=12, b=1)
  length = 4
  o, s = dr.delta_rule_chunk_before_write(*map(jnp.asarray, (q, k, v, g, beta)), chunk_len=length,
                                          initial_state=jnp.asarray(s0), output_final_state=True, inner_chunk_size=3)
  scale = q.shape[-1] ** -0.5
  state = s0[0].astype(np.float64)  # [H, K, V]
  want = np.zeros(v.shape[1:], np.float64)
  for c in range(q.shape[1] // length):
    before = state.copy()
    for t in range(c * length, (c + 1) * length):
      for h in range(q.shape[2]):
        want[t, h] = before[h].T @ (scale * q[0, t, h])
        if t == c * length:
          state[h] = np.exp(g[0, t, h])[:, None] * state[h]
        state[h] = state[h] + beta[0, t, h] * np.outer(k[0, t, h], v[0, t, h] - state[h].T @ k[0, t, h])
  np.testing.assert_allclose(o[0], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(s[0], state, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("chunk,t", [(16, 37), (64, 37), (4, 9)])
def test_write_equals_the_recurrence_with_zero_queries_and_decays(chunk, t):
  """LOCI's chunk write: the final state and its gradients (k, v, beta, the initial state) equal the token-by-token
  recurrence's with ``q = 0``, ``g = 0``, for lengths that are and are not multiples of the chunk."""
  _, k, v, _, beta, s0 = map(jnp.asarray, _inputs(6, "kda", t=t))
  zeros = jnp.zeros_like(k)
  write = lambda k, v, beta, s0: dr.delta_rule_write(k, v, beta, initial_state=s0, chunk_size=chunk)
  recur = lambda k, v, beta, s0: dr.delta_rule_recurrent(zeros, k, v, zeros, beta, initial_state=s0,
                                                         output_final_state=True)[1]
  assert _rel(write(k, v, beta, s0), recur(k, v, beta, s0)) <= 1e-5
  assert _rel(dr.delta_rule_write(k, v, beta, chunk_size=chunk), recur(k, v, beta, jnp.zeros_like(s0))) <= 1e-5
  grad = lambda f: jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=(0, 1, 2, 3))(k, v, beta, s0)
  for name, a, b in zip(["k", "v", "beta", "initial_state"], grad(write), grad(recur)):
    assert _rel(a, b) <= 1e-5, (name, _rel(a, b))
  with pytest.raises(ValueError, match="beta shape"):
    dr.delta_rule_write(k, v, beta[..., None])


@pytest.mark.parametrize("impl", ["pallas_tpu", "pallas_gpu"])
def test_kernels_write_as_the_reference(impl):
  dk, dv = (8, 8) if impl == "pallas_tpu" else (6, 12)
  _, k, v, _, beta, s0 = map(jnp.asarray, _inputs(7, "kda", t=21, b=1, dk=dk, dv=dv))
  got = kernels.delta_rule_write(k, v, beta, initial_state=s0, chunk_size=8, impl=impl, interpret=True)
  assert _rel(got, kernels.delta_rule_write(k, v, beta, initial_state=s0, chunk_size=8)) <= 1e-5
  with pytest.raises(ValueError, match=r"impl must be one of .*got impl='triton'"):
    kernels.delta_rule_write(k, v, beta, impl="triton")


def test_bad_shapes_name_the_argument():
  q, k, v, g, beta, _ = map(jnp.asarray, _inputs(4, "kda", t=8))
  with pytest.raises(ValueError, match="beta shape"):
    dr.delta_rule_chunked(q, k, v, g, beta[..., None])
  with pytest.raises(ValueError, match="g shape"):
    dr.delta_rule_recurrent(q, k, v, g[..., :3], beta)
  with pytest.raises(ValueError, match=r"impl must be one of .*got impl='triton'"):
    kernels.delta_rule_chunked(q, k, v, g, beta, impl="triton")


@pytest.mark.parametrize("impl", ["pallas_tpu", "pallas_gpu"])
@pytest.mark.parametrize("gate", ["kda", "gdn"])
def test_kernels_match_the_reference(impl, gate):
  dk, dv = (8, 8) if impl == "pallas_tpu" else (6, 12)  # GPU: channels zero-padded to powers of two
  arrays = _inputs(5, gate, t=21, b=1, dk=dk, dv=dv)  # 21 tokens: padded to chunks of 8

  def run(which):
    fn = lambda *a, **kw: kernels.delta_rule_chunked(*a, chunk_size=8, impl=which, interpret=True, **kw)
    return _jax_run(fn, arrays, use_s0=True)

  o_k, s_k, g_k = run(impl)
  o_r, s_r, g_r = run("xla")
  assert _rel(o_k, o_r) <= 1e-5 and _rel(s_k, s_r) <= 1e-5
  for name, a, b in zip(["q", "k", "v", "g", "beta", "initial_state"], g_k, g_r):
    assert _rel(a, b) <= 1e-5, (name, _rel(a, b))
