"""``impl='xla_lse'`` (``xla_kernels.softmax_attention``): the log-sum-exp backward against JAX differentiating
the reference (``jaxwm.ops.attention``), for dense attention under every mask form (none, per example, shared,
per head, static and traced frame masks), odd and unequal lengths, bfloat16, WorldRoPE's per-view logits, and a
small WorldRoPE model's loss and gradients; and the property it exists for: no ``[Lq, Lk]`` array among the
residuals the forward keeps for the backward (the reference keeps the probabilities)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import kernels
from jaxwm.ops import attention as attn_ref
from xla_kernels import softmax_attention as lse

B, LQ, LK, H, D = 2, 37, 53, 3, 16


def _inputs(dtype=jnp.float32, lq=LQ, lk=LK, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (B, lq, H, D), dtype)
  k = jax.random.normal(ks[1], (B, lk, H, D), dtype)
  v = jax.random.normal(ks[2], (B, lk, H, D), dtype)
  g = jax.random.normal(ks[3], (B, lq, H, D), jnp.float32)  # a cotangent that is not all ones
  return q, k, v, g


def _random_mask(shape, seed=1):
  m = np.random.default_rng(seed).random(shape) < 0.6
  m[..., 0] = True  # every query attends to a key
  return jnp.asarray(m)


def _frame_masks():
  frames = np.tril(np.ones((5, 5), bool))  # 5 frames of 7 tokens: causal over frames
  traced = np.stack([frames, np.eye(5, dtype=bool) | frames[::-1, ::-1].T])
  return {"static_frames": attn_ref.StaticFrameMask(frames, 7),
          "traced_frames": attn_ref.FrameMask(jnp.asarray(traced), 7)}


MASKS = {"none": None, "per_example": _random_mask((B, LQ, LK)), "shared": _random_mask((1, LQ, LK), 2),
         "per_head": _random_mask((B, H, LQ, LK), 3)}


def _value_and_grads(fn, q, k, v, g, mask):
  out, pull = jax.vjp(lambda q, k, v: fn(q, k, v, mask), q, k, v)
  return (out, *pull(g.astype(out.dtype)))


def _compare(q, k, v, g, mask, atol):
  want = _value_and_grads(attn_ref.dot_product_attention, q, k, v, g, mask)
  got = _value_and_grads(lambda q, k, v, m: kernels.dot_product_attention(q, k, v, m, impl="xla_lse"), q, k, v, g,
                         mask)
  for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=atol, err_msg=name)


@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
def test_dense_matches_the_reference_and_its_gradients(mask):
  _compare(*_inputs(), MASKS[mask], atol=2e-5)


@pytest.mark.parametrize("kind", ["static_frames", "traced_frames"])
def test_frame_masks_match(kind):
  q, k, v, g = _inputs(lq=35, lk=35)
  _compare(q, k, v, g, _frame_masks()[kind], atol=2e-5)


def test_bfloat16_matches_within_bfloat16():
  q, k, v, g = _inputs(jnp.bfloat16)
  _compare(q, k, v, g, MASKS["per_example"], atol=6e-2)


def test_scale_and_jit():
  q, k, v, g = _inputs()
  want = _value_and_grads(lambda q, k, v, m: attn_ref.dot_product_attention(q, k, v, m, scale=0.3), q, k, v, g, None)
  got = jax.jit(lambda q, k, v, g: _value_and_grads(
      lambda q, k, v, m: lse.attention(q, k, v, m, scale=0.3), q, k, v, g, None))(q, k, v, g)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def _largest_residual(fn, q, k, v, mask):
  """Elements of the largest array the forward keeps for the backward."""
  _, pull = jax.vjp(lambda q, k, v: fn(q, k, v, mask), q, k, v)
  return max(int(np.prod(a.shape)) for a in jax.tree.leaves(pull) if hasattr(a, "shape"))


def test_the_backward_keeps_no_score_matrix():
  q, k, v, _ = _inputs()
  mask = MASKS["per_example"]
  scores = B * H * LQ * LK
  assert _largest_residual(attn_ref.dot_product_attention, q, k, v, mask) >= scores  # the reference keeps P
  got = _largest_residual(lambda q, k, v, m: lse.attention(q, k, v, m), q, k, v, mask)
  assert got <= max(B * LQ * LK, B * LK * H * D), got  # at most the mask and the inputs


def test_per_view_attention_matches_the_reference():
  """WorldRoPE's per-view logits (each query frame its own rotation of the keys' h/w channel pairs) through both
  impls."""
  fq, n, lk, pairs = 3, 5, 19, (2, 3, 4)
  ks = jax.random.split(jax.random.key(4), 5)
  q = jax.random.normal(ks[0], (B, fq * n, H, D))
  k = jax.random.normal(ks[1], (B, lk, H, D))
  v = jax.random.normal(ks[2], (B, lk, H, D))
  factors = jax.random.normal(ks[3], (B, fq, lk, len(pairs), 2))
  g = jax.random.normal(ks[4], (B, fq * n, H, D))
  mask = _random_mask((B, fq * n, lk), 5)

  def run(impl):
    fn = lambda *a: kernels.per_view_attention(*a, pairs, mask, scale=0.3, impl=impl)  # pylint: disable=unnecessary-lambda-assignment
    out, pull = jax.vjp(fn, q, k, v, factors)
    return (out, *pull(g))

  for name, a, b in zip(("out", "dq", "dk", "dv", "dfactors"), run("xla_lse"), run("xla")):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, err_msg=name)
  with pytest.raises(ValueError, match="'xla', 'xla_lse' and 'cpu_flash'"):
    kernels.per_view_attention(q, k, v, factors, pairs, mask, scale=0.3, impl="splash")


def model_loss_and_grads(impls, encoding, channels, dim=32, num_layers=1, remat="none", hlo=False):
  """``[(loss, parameter gradients)]`` per ``model.attention_impl`` of ``impls``: a teacher-forcing step of a small
  model (``encoding`` on ``channels``, ``model.remat=remat``) under the chunk-causal frame mask, on the same
  parameters and clip (``hlo``: the compiled programs' HLO text instead)."""
  from jaxwm.models.conditioning import Cameras  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import CameraConfig, ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.init import init_params  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.training.layout import teacher_forcing_layout  # pylint: disable=g-import-not-at-top
  layout = teacher_forcing_layout(3, 1)
  s = layout.mask.shape[0]
  cfg = ModelConfig(dim=dim, num_heads=2, num_layers=num_layers, ffn_dim=32, in_channels=12, out_channels=12,
                    patch_size=(1, 1, 1), freq_dim=16, camera=CameraConfig(encoding=encoding, channels=channels),
                    remat=remat)
  shape = (2, s, 2, 3, 12)
  x = jax.random.normal(jax.random.key(0), shape)
  c2w = jnp.tile(jnp.eye(4), (2, s, 1, 1)).at[:, :, 0, 3].set(jnp.linspace(0, 1, s))
  k_mat = jnp.tile(jnp.asarray([[3.0, 0, 6], [0, 3.0, 6], [0, 0, 1]]), (2, s, 1, 1))
  frames = layout.frames(2, cameras=Cameras(c2w, k_mat))
  params = nn.unbox(init_params(WanModel(cfg), jax.random.key(1), shape, 24))

  def loss(p, impl):
    model = WanModel(dataclasses.replace(cfg, attention_impl=impl))
    return jnp.mean(jnp.square(model.apply({"params": p}, x, jnp.full(shape[:2], 500.0), frames)[0] - x))

  steps = [jax.jit(jax.value_and_grad(lambda p, impl=impl: loss(p, impl))) for impl in impls]
  if hlo:
    return [step.lower(params).compile().as_text() for step in steps]
  return [step(params) for step in steps]


def assert_same_loss_and_grads(got, want):
  np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-6)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got[1]), jax.tree.leaves(want[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_tiny_model_loss_and_gradients_match():
  """The teacher-forcing loss of a small WorldRoPE model (per-view attention) and its parameter gradients:
  ``xla_lse`` equals ``xla``. (Dense attention in a model: the Wan parity tests check the default model, whose
  ``auto`` is ``cpu_flash`` on CPU with g++ and ``xla_lse`` without, against diffusers.)"""
  want, got = model_loss_and_grads(("xla", "xla_lse"), "worldrope", "hw")
  assert_same_loss_and_grads(got, want)
