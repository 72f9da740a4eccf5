"""WorldRoPE's view factors as a C++ kernel (``xla_kernels/cpu_view_factors.cc``, ``impl='cpu_flash'``) against the
``jnp`` reference (``jaxwm.ops.view_factors``) run in float64: values and the gradients of every input (the key
Gaussians and the query cameras) over key counts off its blocks, one to three hypotheses, pair counts below, at and
above one vector, axial and mixed frequencies, skewed intrinsics and hypotheses behind a camera. And NaN as the
reference propagates it, thread counts, a device mesh, ``vmap``, the choice of impl and the refusals."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_rotations

from jaxwm import kernels
from jaxwm.encodings import worldrope as wr
from jaxwm.geometry.rotations import make_se3
from jaxwm.ops import view_factors as vf_ref

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="cpu_flash builds its kernel with g++")

HEAD_DIM = 48  # RoPE pairs 8..23 are h/w
PIXELS = 4.0


FREQS = {  # [P, 2] in token-grid units
    "axial16": wr.hw_frequencies(HEAD_DIM, range(8, 24)),  # the default model's 16 h/w pairs: one vector
    "mixed3": wr.hw_frequencies(HEAD_DIM, (9, 20, 12), mixed=True),
    "axial1": wr.hw_frequencies(HEAD_DIM, (11,)),
    "mixed17": np.asarray(wr.mixed_frequencies(jnp.geomspace(1.0, 0.01, 17))),  # one lane over a vector
}


def _case(b, lk, m, fq, freqs, seed=0):
  """Key Gaussians from random depths seen by random cameras, query cameras around them (view 0 turned round:
  some hypotheses behind it), skewed intrinsics, and a cotangent."""
  rng = np.random.default_rng(seed)
  kk = np.array([[40.0, 0.7, 30.0], [0.0, 38.0, 33.0], [0.0, 0.0, 1.0]])
  f32 = lambda a: jnp.asarray(a, jnp.float32)  # pylint: disable=unnecessary-lambda-assignment
  key_cams = np.stack([make_se3(r, rng.normal(size=3) * 0.2) for r in random_rotations(rng, b * lk)])
  mean, root = wr.unproject_gaussians(f32(rng.uniform(0, 64, (b, lk, 2))), f32(rng.uniform(0.5, 6, (b, lk, m))),
                                      f32(rng.uniform(0.05, 0.5, (b, lk, m))), f32(np.tile(kk, (b, lk, 1, 1))),
                                      f32(key_cams.reshape(b, lk, 4, 4)), PIXELS)
  gauss = {"mean": mean, "root": root, "alpha": jax.nn.softmax(f32(rng.normal(size=(b, lk, m))))}
  q_c2w = np.stack([make_se3(r, rng.normal(size=3) * 0.3) for r in random_rotations(rng, b * fq)])
  q_c2w = q_c2w.reshape(b, fq, 4, 4)
  q_c2w[:, 0] = make_se3(np.diag([1.0, -1.0, -1.0]), np.array([0.0, 0.0, 3.0]))  # turned round: some behind it
  q_k = np.tile(kk, (b, fq, 1, 1)) * rng.uniform(0.9, 1.1, (b, fq, 1, 1))
  q_k[..., 2, :] = [0, 0, 1]
  ct = f32(rng.normal(size=(b, fq, lk, len(freqs), 2)))
  return gauss, f32(q_k), f32(q_c2w), np.asarray(freqs, np.float32), ct


def _value_and_grads(impl, gauss, q_k, q_c2w, freqs, ct):
  out, pull = jax.vjp(lambda g, k, c: kernels.view_factors(g, k, c, freqs, PIXELS, impl=impl), gauss, q_k, q_c2w)
  return out, pull(ct)


def _run(impl, gauss, q_k, q_c2w, freqs, ct):
  """:func:`_value_and_grads` under ``jit``, the frequencies static."""
  return jax.jit(lambda g, k, c, t: _value_and_grads(impl, g, k, c, freqs, t))(gauss, q_k, q_c2w, ct)


def _flat(t):
  out, (g, dk, dc) = t
  return out, g["mean"], g["root"], g["alpha"], dk, dc


def _float64(gauss, q_k, q_c2w, freqs, ct):
  with jax.enable_x64(True):
    f64 = lambda t: jax.tree.map(lambda a: jnp.asarray(np.asarray(a), jnp.float64), t)  # pylint: disable=unnecessary-lambda-assignment
    out = _value_and_grads("xla", f64(gauss), f64(q_k), f64(q_c2w), np.asarray(freqs, np.float64), f64(ct))
    return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("b, lk, m, fq, freqs", [
    (2, 37, 3, 3, "axial16"),  # 37 keys: blocks of 16, 16 and 5
    (1, 16, 1, 2, "mixed3"),   # one hypothesis, scattered pairs, mixed frequencies
    (1, 5, 2, 1, "mixed17"),   # one pair over a vector
    (1, 7, 4, 2, "axial1"),
])
def test_values_and_gradients_match_float64(b, lk, m, fq, freqs):
  """Values and the gradients of every input against the reference in float64: the kernel's error is within a few
  times the float32 reference's own."""
  case = _case(b, lk, m, fq, FREQS[freqs], seed=lk)
  want = _flat(_float64(*case))
  got, ref32 = _flat(_run("cpu_flash", *case)), _flat(_run("xla", *case))
  # errors relative to each entry's own scale (per pair, coordinate, matrix entry and view: a wrong small entry,
  # such as one camera parameter's gradient or one view's, is not hidden by a large one)
  per = {"factors": (0, 2), "mean": (0, 1, 2), "root": (0, 1, 2), "alpha": (0, 1), "q_intrinsics": (0,),
         "q_c2w": (0,)}
  for name, x, y, r in zip(per, got, want, ref32):
    x, r = np.asarray(x), np.asarray(r)
    assert x.dtype == np.float32 and x.shape == y.shape, name
    scale = np.abs(y).max(axis=per[name], keepdims=True)
    assert scale.max() > 0, name
    zero = np.broadcast_to(scale == 0, y.shape)
    assert not x[zero].any(), name  # where the float64 gradient is exactly 0, so is the kernel's
    scale = np.where(scale == 0, 1.0, scale)
    err, err32 = ((np.abs(a - y) / scale).max() for a in (x, r))
    assert err <= max(4 * err32, 3e-6), (name, err, err32)
  assert np.abs(got[0]).max() > 0.1  # not all attenuated away
  in_front = np.asarray(vf_ref.project_gaussians(case[0]["mean"][:, None], case[0]["root"][:, None],
                                                 case[1][:, :, None], case[2][:, :, None])[2])
  assert in_front.any() and not in_front.all()  # some hypotheses are behind a query camera
  dk, dc = np.asarray(got[4]), np.asarray(got[5])  # entries the maths never reads get 0
  assert not dk[..., 1, 0].any() and not dk[..., 2, :].any() and not dc[..., 3, :].any()
  assert dk.any() and dc[..., :3, :].any()


def test_nan_propagates_as_in_the_reference():
  """Values: a NaN weight reaches its key's factors in every view (the reference multiplies it by 0 behind a camera,
  still NaN); a NaN position puts the hypothesis behind every camera (``z > eps`` is false), adding nothing; other
  keys are unchanged. (Gradients differ there: the kernel gives the NaN position's hypothesis 0, where the
  reference's transposed products give NaN times 0.)"""
  gauss, q_k, q_c2w, freqs, _ = _case(1, 20, 2, 2, FREQS["axial16"], seed=3)
  gauss = dict(gauss, alpha=gauss["alpha"].at[0, 4, 1].set(jnp.nan), mean=gauss["mean"].at[0, 9, 0].set(jnp.nan))
  got, want = (np.asarray(kernels.view_factors(gauss, q_k, q_c2w, freqs, PIXELS, impl=i)) for i in ("cpu_flash", "xla"))
  assert np.isnan(got[0, :, 4]).all() and np.isnan(want[0, :, 4]).all()
  np.testing.assert_allclose(np.delete(got, 4, axis=2), np.delete(want, 4, axis=2), atol=2e-5)


def test_thread_counts_give_the_same_bits(monkeypatch):
  """The units split over 1 and 3 OpenMP threads give identical values and gradients: the cameras' gradients are
  summed in unit order, whatever the thread count."""
  from xla_kernels import cpu_view_factors  # pylint: disable=g-import-not-at-top
  case = _case(3, 41, 2, 3, FREQS["axial16"], seed=4)
  results = []
  for n in (1, 3):
    monkeypatch.setattr(cpu_view_factors, "threads", lambda n=n: n)

    def run(g, k, c, t):  # a new function per thread count: traced again, with this count
      return _value_and_grads("cpu_flash", g, k, c, case[3], t)

    args = (*case[:3], case[4])
    assert f"threads = {n} : i64" in jax.jit(run).lower(*args).as_text()
    results.append(jax.jit(run)(*args))
  for x, y in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_per_batch_shard_on_a_mesh_and_vmap_equal_one_call():
  """On a 2-device mesh (per batch shard) and under ``vmap`` (one call per element), values and gradients are
  those of one call."""
  gauss, q_k, q_c2w, freqs, ct = _case(4, 19, 2, 2, FREQS["mixed3"], seed=6)

  def run(gauss, q_k, q_c2w, ct):
    out, pull = jax.vjp(lambda *a: kernels.view_factors(*a, freqs, PIXELS, impl="cpu_flash", batch_axes=("data",)),
                        gauss, q_k, q_c2w)
    return out, pull(ct)

  want = jax.jit(run)(gauss, q_k, q_c2w, ct)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("data",))
  with jax.set_mesh(mesh):
    put = lambda t: jax.device_put(t, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))  # pylint: disable=unnecessary-lambda-assignment
    got = jax.jit(run)(*map(put, (gauss, q_k, q_c2w, ct)))
    assert "shard_map" in str(jax.make_jaxpr(run)(gauss, q_k, q_c2w, ct))
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
  one = lambda g, k, c: kernels.view_factors(g, k, c, freqs, PIXELS, impl="cpu_flash")  # pylint: disable=unnecessary-lambda-assignment
  halves = jax.tree.map(lambda a: a.reshape(2, 2, *a.shape[1:]), (gauss, q_k, q_c2w))
  stacked = jax.vmap(one)(*halves)
  for i in range(2):
    np.testing.assert_allclose(np.asarray(stacked[i]), np.asarray(one(*jax.tree.map(lambda a, i=i: a[i], halves))),
                               atol=1e-6)


def test_impl_choice_and_refusals(monkeypatch, tmp_path, caplog):
  """``model.attention_impl`` -> the factors' impl: ``cpu_flash`` and ``auto`` on CPU take the kernel, the others
  the reference; ``auto`` without a compiler takes the reference with one warning. Wrong dtypes, shapes, impl names
  and other platforms are refused by name."""
  resolve = kernels.resolve_view_factors_impl
  assert [resolve(i) for i in ("cpu_flash", "auto", "xla", "xla_lse", "splash", "cudnn")] == \
      ["cpu_flash", "cpu_flash", "xla", "xla", "xla", "xla"]
  with pytest.raises(ValueError, match="model.attention_impl='flash'"):
    resolve("flash")
  gauss, q_k, q_c2w, freqs, _ = _case(1, 6, 2, 2, FREQS["axial1"])
  with pytest.raises(ValueError, match="impl must be one of .'xla', 'cpu_flash'.; got impl='pallas'"):
    kernels.view_factors(gauss, q_k, q_c2w, freqs, PIXELS, impl="pallas")
  with pytest.raises(ValueError, match="cpu_flash.*float32 only; q_c2w is bfloat16"):
    kernels.view_factors(gauss, q_k, q_c2w.astype(jnp.bfloat16), freqs, PIXELS, impl="cpu_flash")
  with pytest.raises(ValueError, match="are not .B, Lk, M, 3."):
    kernels.view_factors(gauss, q_k[:, :1], q_c2w, freqs, PIXELS, impl="cpu_flash")
  with pytest.raises(ValueError, match="pixels_per_token=0.0: must be a positive number"):
    kernels.view_factors(gauss, q_k, q_c2w, freqs, 0.0, impl="cpu_flash")
  with pytest.raises(ValueError, match=r"freqs must be static \[P, 2\] frequencies .NumPy.; got ndarray of shape \(3,\)"):
    kernels.view_factors(gauss, q_k, q_c2w, np.ones(3), PIXELS, impl="cpu_flash")
  with pytest.raises(ValueError, match="freqs must be static"):
    jax.jit(lambda f: kernels.view_factors(gauss, q_k, q_c2w, f, PIXELS, impl="cpu_flash"))(jnp.asarray(freqs))
  from jax import export  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="WorldRoPE's factors: a CPU kernel.*cannot be lowered for platform cuda"):
    export.export(jax.jit(lambda g, k, c: kernels.view_factors(g, k, c, freqs, PIXELS, impl="cpu_flash")),
                  platforms=["cuda"])(gauss, q_k, q_c2w)
  from xla_kernels import cpu_view_factors  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(cpu_view_factors, "_loaded", [])
  monkeypatch.setattr(cpu_view_factors, "_unavailable", [])
  monkeypatch.setenv("CXX", "no-such-compiler")
  monkeypatch.setenv("JAXWM_KERNEL_CACHE", str(tmp_path))
  with caplog.at_level("WARNING"):
    assert resolve("auto") == resolve("auto") == "xla"
  assert sum("factors use the jnp reference" in r.message for r in caplog.records) == 1


def test_the_samplers_cache_views_match_the_reference():
  """``WorldRoPE.cache_views`` (every layer's cached keys seen from the chunk's views) with the kernel equals the
  reference's per-view loop."""
  from jaxwm.encodings.worldrope import ENCODING  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(8)
  gauss, q_k, q_c2w, _, _ = _case(2, 11, 4, 3, FREQS["axial16"], seed=8)
  layers = 2
  stack = lambda a: jnp.stack([a, a * 1.01])  # pylint: disable=unnecessary-lambda-assignment
  cache = {"k": jnp.asarray(rng.normal(size=(layers, 2, 11, 4, HEAD_DIM)), jnp.float32),
           **{f"wr_{n}": stack(gauss[n]) for n in ("mean", "root", "alpha")}}
  out = {}
  for impl in ("xla", "cpu_flash"):
    cfg = ModelConfig.from_dict({"dim": 4 * HEAD_DIM, "num_heads": 4, "attention_impl": impl,
                                 "camera": {"encoding": "worldrope", "channels": "hw"}})
    out[impl] = np.asarray(ENCODING.cache_views(cfg, cache, q_c2w, q_k)["wr_views"])
  np.testing.assert_allclose(out["cpu_flash"], out["xla"], atol=2e-5)


def test_dots_and_kernels_remat_runs_each_kernel_once_with_the_same_gradients():
  """``model.remat="dots_and_kernels"`` saves the kernels' outputs: a small WorldRoPE model's compiled step runs the
  attention and factor kernels' forwards as often as without remat (``full`` runs them again in the backward), and
  its loss and gradients are those without remat."""
  from test_xla_kernels import assert_same_loss_and_grads, model_loss_and_grads  # pylint: disable=g-import-not-at-top
  counts = {}
  for remat in ("none", "dots_and_kernels", "full"):
    text = model_loss_and_grads(("cpu_flash",), "worldrope", "hw", dim=64, num_layers=2, remat=remat, hlo=True)[0]
    counts[remat] = [text.count(f'custom_call_target="{t}"') for t in ("jaxwm_cpu_attention_fwd",
                                                                       "jaxwm_cpu_view_factors_fwd")]
  assert counts["none"] == counts["dots_and_kernels"] == [1, 1], counts
  assert counts["full"] == [2, 2], counts
  want, = model_loss_and_grads(("cpu_flash",), "worldrope", "hw", dim=64, num_layers=2)
  got, = model_loss_and_grads(("cpu_flash",), "worldrope", "hw", dim=64, num_layers=2, remat="dots_and_kernels")
  assert_same_loss_and_grads(got, want)
