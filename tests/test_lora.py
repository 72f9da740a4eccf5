"""LoRA adapters (jaxwm.lora): targets and exclusions on the real parameter tree, identity at init, training
updates only the factors, merged equals unmerged, and the adapter checkpoint round trip."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import random_intrinsics, random_poses, tiny_config

from jaxwm import lora
from jaxwm.lora import adapters
from jaxwm.models.conditioning import Cameras
from jaxwm.models.config import ModelConfig
from jaxwm.models.init import init_frames, init_params
from jaxwm.models.transformer import WanModel
from jaxwm.training.layout import teacher_forcing_layout
from jaxwm.training.step import make_loss_fn

SPEC = lora.LoraSpec(rank=4, alpha=8.0)
SHAPE = (1, 3, 4, 4, 48)  # [B, S, h, w, C] latents of 16x16 frames
# Parameters that must never get factors: the camera/pose path, LOCI memory, embeddings, norms, biases, tables, head.
NEVER = re.compile(r"plucker|mrope|depth_head|memory|mem_gate|embed|norm|bias|scale_shift_table|proj_out")


def _model_config(**camera):
  c = tiny_config()
  c.model.camera.update(encoding="mrope", plucker=True, **camera)
  c.model.loci.update(enabled=True, blocks=(1,))  # stacks blocks_0_1 (softmax) and blocks_1_2 (hybrid)
  return c


def _abstract(model_dict):
  model = WanModel(ModelConfig.from_dict(model_dict))
  return nn.unbox(jax.eval_shape(lambda k: init_params(model, k, SHAPE, 16), jax.random.key(0)))


@pytest.fixture(scope="module", name="setup")
def _setup():
  c = _model_config()
  model = WanModel(ModelConfig.from_dict(c.model))
  params = nn.unbox(init_params(model, jax.random.key(0), SHAPE, 16))
  rng = np.random.default_rng(0)
  cameras = Cameras(jnp.asarray(random_poses(rng, 3)[None], jnp.float32),
                    jnp.asarray(random_intrinsics(rng, 3, (16, 16))[None], jnp.float32))
  frames = init_frames(SHAPE, 16).replace(cameras=cameras)
  x = jax.random.normal(jax.random.key(1), SHAPE)
  ts = jnp.array([[0.0, 400.0, 900.0]])
  fwd = jax.jit(lambda p: model.apply({"params": p}, x, ts, frames)[0])

  @jax.jit
  def fwd_unmerged(p, adapter):
    with lora.unmerged(SPEC):
      return model.apply({"params": lora.unmerged_params(p, adapter)}, x, ts, frames)[0]

  adapter = lora.init_lora(jax.random.key(2), params, SPEC)
  return dict(config=c, model=model, params=params, fwd=fwd, fwd_unmerged=fwd_unmerged, adapter=adapter)


def _random_b(adapter, key=3):
  """The adapter with non-zero ``b`` (as after training)."""
  leaves, tree = jax.tree_util.tree_flatten_with_path(adapter)
  keys = jax.random.split(jax.random.key(key), len(leaves))
  return jax.tree_util.tree_unflatten(tree, [0.1 * jax.random.normal(k, x.shape) if path[-1].key == "b" else x
                                             for k, (path, x) in zip(keys, leaves)])


def test_targets_attention_and_ffn_of_every_stack_never_the_camera_path():
  c = _model_config()
  c.model.cross_attn = True
  worldrope = tiny_config(**{"model.camera.encoding": "worldrope", "model.camera.channels": "hw"})
  for model_dict in (c.model, worldrope.model):
    params = _abstract(model_dict)
    flat = lora.flat_paths(params)
    targets = lora.lora_targets(params, SPEC)
    want = [p for p in flat
            if re.fullmatch(r"blocks(_\d+_\d+)?/(attn[12]/to_(q|k|v|out)|ffn_(in|out))/kernel", p)]
    assert targets == sorted(want) and targets
    assert not [p for p in targets if NEVER.search(p)]
    # Excluded by rule: even a spec including every kernel leaves the camera path, memory, embeddings, head alone.
    everything = lora.lora_targets(params, lora.LoraSpec(rank=4, include=(r"kernel$",)))
    assert set(targets) <= set(everything) and not [p for p in everything if NEVER.search(p)]
    # The camera path exists in these models and is left alone.
    assert any(re.search(r"plucker|mrope|depth_head", p) for p in flat)
    adapter = lora.init_lora(jax.random.key(0), params, SPEC)
    assert sorted(lora.factors(adapter)) == targets
    for path, (a, b) in lora.factors(adapter).items():
      *lead, n_in, n_out = flat[path].shape
      assert len(lead) == 1  # scanned stacks [L, in, out]: the factors carry the layer axis
      assert a.shape == (*lead, n_in, 4) and b.shape == (*lead, 4, n_out) and not np.any(b)
  assert "blocks_0_1/attn2/to_q/kernel" in lora.lora_targets(_abstract(c.model), SPEC)
  with pytest.raises(ValueError, match="targets no parameter"):
    lora.init_lora(jax.random.key(0), params, lora.LoraSpec(rank=2, include=(r"plucker_in/kernel$",)))


def test_the_blocks_io_set_adds_the_embeddings_and_the_head_and_still_never_the_camera_path():
  c = _model_config()
  c.model.cross_attn = True  # a text embedder exists and must stay out
  worldrope = tiny_config(**{"model.camera.encoding": "worldrope", "model.camera.channels": "hw"})
  io = re.compile(r"^(patch_embedding|condition_embedder/time_(embedder_[12]|proj)|proj_out)/kernel$")
  camera = re.compile(r"plucker|mrope|depth_head|memory|mem_gate|text|norm|bias|scale_shift_table")
  for model_dict in (c.model, worldrope.model):
    params = _abstract(model_dict)
    flat = lora.flat_paths(params)
    blocks = lora.lora_targets(params, lora.LoraSpec.of("blocks", 4, 4.0))
    both = lora.lora_targets(params, lora.LoraSpec.of("blocks_io", 4, 4.0))
    assert blocks == lora.lora_targets(params, SPEC)  # "blocks" is the default spec
    want_io = sorted(p for p in flat if io.search(p))
    assert len(want_io) == 5 and sorted(set(both) - set(blocks)) == want_io and set(blocks) <= set(both)
    assert not [p for p in both if camera.search(p)]
    assert any(re.search(r"text_embedder|plucker|depth_head", p) for p in flat)
    # The head gets factors of the full rank of its small side (rank > out is allowed).
    adapter = lora.init_lora(jax.random.key(0), params, lora.LoraSpec.of("blocks_io", 64, 64.0))
    a, b = lora.factors(adapter)["proj_out/kernel"]
    assert a.shape == (flat["proj_out/kernel"].shape[0], 64) and b.shape == (64, flat["proj_out/kernel"].shape[1])
  with pytest.raises(ValueError, match="targets='all': must be one of 'blocks', 'blocks_io'"):
    lora.LoraSpec.of("all", 4, 4.0)


def test_apply_is_w_plus_scaled_product_on_stacked_and_plain_kernels():
  rng = np.random.default_rng(0)
  params = {"blocks": {"ffn_in": {"kernel": rng.normal(size=(3, 5, 7)).astype(np.float32),
                                  "bias": np.zeros((3, 7), np.float32)}},
            "other": {"ffn_in": {"kernel": rng.normal(size=(5, 7)).astype(np.float32)}}}
  spec = lora.LoraSpec(rank=2, alpha=3.0, include=(r"ffn_in/kernel$",))
  adapter = _random_b(lora.init_lora(jax.random.key(0), params, spec))
  out = jax.jit(lambda p, a: lora.apply_lora(p, a, spec))(params, adapter)
  for path in ("blocks/ffn_in/kernel", "other/ffn_in/kernel"):
    a, b = (np.asarray(x, np.float64) for x in lora.factors(adapter)[path])
    w = lora.flat_paths(params)[path]
    np.testing.assert_allclose(lora.flat_paths(out)[path], w + 1.5 * a @ b, rtol=1e-5, atol=1e-6)
  assert lora.apply_lora(params, adapter, spec)["blocks"]["ffn_in"]["bias"] is params["blocks"]["ffn_in"]["bias"]
  assert lora.apply_lora(params, adapter, spec, enabled=False) is params
  assert lora.lora_param_count(adapter) == 3 * 2 * (5 + 7) + 2 * (5 + 7)


def test_adapter_at_init_gives_bit_identical_outputs(setup):
  fwd, params, adapter = setup["fwd"], setup["params"], setup["adapter"]
  base = np.asarray(fwd(params))
  np.testing.assert_array_equal(np.asarray(fwd(lora.apply_lora(params, adapter, SPEC))), base)
  np.testing.assert_array_equal(np.asarray(setup["fwd_unmerged"](params, adapter)), base)
  for p in lora.factors(adapter):
    merged = lora.flat_paths(lora.merge(params, adapter, SPEC))
    np.testing.assert_array_equal(merged[p], lora.flat_paths(params)[p])


def test_one_step_updates_only_the_lora_factors(setup):
  c, model, params = setup["config"], setup["model"], setup["params"]
  layout = teacher_forcing_layout(5, 2)
  loss_fn = make_loss_fn(model, layout, c.recipe, 4)
  rng = np.random.default_rng(1)
  batch = {"frames": jnp.asarray(rng.integers(0, 256, (2, 5, 16, 16, 3)), jnp.uint8),
           "c2w": jnp.asarray(np.stack([random_poses(rng, 5) for _ in range(2)]), jnp.float32),
           "intrinsics": jnp.asarray(np.stack([random_intrinsics(rng, 5, (16, 16)) for _ in range(2)]), jnp.float32)}
  tx = lora.lora_optimizer(optax.adam(1e-2))
  state = lora.combine(params, setup["adapter"])
  opt_state = tx.init(state)

  @jax.jit
  def step(state, opt_state):
    def loss(tree):
      return loss_fn(lora.apply_lora(jax.lax.stop_gradient(tree["base"]), tree["lora"], SPEC), batch,
                     jax.random.key(0))
    value, grads = jax.value_and_grad(loss)(state)
    updates, opt_state = tx.update(grads, opt_state, state)
    return optax.apply_updates(state, updates), opt_state, value, grads

  new, _, value, grads = step(state, opt_state)
  assert np.isfinite(float(value))
  # Gradients reach the LoRA factors only; the base (camera path included) is bit-unchanged.
  assert all(not np.any(g) for g in jax.tree_util.tree_leaves(grads["base"]))
  for p, (a, b) in lora.factors(grads["lora"]).items():
    assert np.any(b), p
  new_base = lora.flat_paths(new["base"])
  for path, w in lora.flat_paths(params).items():
    np.testing.assert_array_equal(np.asarray(new_base[path]), np.asarray(w), err_msg=path)
  old = lora.factors(setup["adapter"])
  for p, (a, b) in lora.factors(new["lora"]).items():
    assert np.any(np.asarray(b) != np.asarray(old[p][1])), p
  # The optimizer alone also freezes the base: base gradients of ones give zero updates and no state.
  ones = jax.tree_util.tree_map(jnp.ones_like, state)
  updates, _ = tx.update(ones, opt_state, state)
  assert all(not np.any(u) for u in jax.tree_util.tree_leaves(updates["base"]))
  assert all(np.any(u) for u in jax.tree_util.tree_leaves(updates["lora"]))
  mask = lora.trainable_mask(state)
  assert not any(jax.tree_util.tree_leaves(mask["base"])) and all(jax.tree_util.tree_leaves(mask["lora"]))


def test_merged_equals_unmerged_forward(setup):
  params, adapter = setup["params"], _random_b(setup["adapter"])
  merged = np.asarray(setup["fwd"](lora.merge(params, adapter, SPEC)))
  unmerged = np.asarray(setup["fwd_unmerged"](params, adapter))
  assert np.abs(merged - np.asarray(setup["fwd"](params))).max() > 1e-2  # the adapter matters
  np.testing.assert_allclose(merged, unmerged, rtol=1e-4, atol=1e-4)


def test_adapter_checkpoint_is_small_and_restores_onto_a_fresh_base(setup, tmp_path):
  params, fwd, adapter = setup["params"], setup["fwd"], _random_b(setup["adapter"])
  step_dir = adapters.save_adapter(tmp_path / "adapter", adapter, SPEC, params, step=7, extra={"num_steps": 4})
  on_disk = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
  base_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
  assert on_disk < base_bytes / 4, (on_disk, base_bytes)  # about 1/7 here: factors 1/23, plus Orbax metadata
  meta = adapters.adapter_metadata(tmp_path / "adapter")
  assert meta["spec"] == SPEC.to_dict() and meta["param_count"] == lora.lora_param_count(adapter)
  assert meta["extra"] == {"num_steps": 4}
  fresh = jax.tree_util.tree_map(lambda x: jnp.array(np.asarray(x)), params)
  notes = []
  loaded, spec = adapters.load_adapter(tmp_path / "adapter", fresh, say=notes.append)
  assert spec == SPEC and not notes
  np.testing.assert_array_equal(np.asarray(fwd(lora.merge(fresh, loaded, spec))),
                                np.asarray(fwd(lora.merge(params, adapter, SPEC))))
  # Another base of the same shapes (other weights) takes it too; so does the step directory itself.
  other = nn.unbox(init_params(setup["model"], jax.random.key(5), SHAPE, 16))
  loaded2, _ = adapters.load_adapter(step_dir, other)
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded2, loaded)


def test_a_mismatched_base_is_refused_in_one_line(setup, tmp_path):
  adapters.save_adapter(tmp_path / "adapter", setup["adapter"], SPEC, setup["params"])
  wider = _model_config()
  wider.model.update(dim=96, num_heads=2)
  without_loci = tiny_config(**{"model.camera.encoding": "mrope", "model.camera.plucker": True}).model
  for model_dict, match in ((wider.model, r"target blocks_0_1/\S+ has shape \(1, 96, \d+\) in the base"),
                            (without_loci, r"target blocks_0_1/\S+ is not a parameter of the base model")):
    base = _abstract(model_dict)
    with pytest.raises(lora.AdapterMismatchError, match=match) as e:
      adapters.load_adapter(tmp_path / "adapter", base)
    assert "\n" not in str(e.value)
    with pytest.raises(lora.AdapterMismatchError):
      lora.apply_lora(base, setup["adapter"], SPEC)
  with pytest.raises(FileNotFoundError, match="no LoRA adapter"):
    adapters.load_adapter(tmp_path / "missing", setup["params"])


def test_factors_and_their_optimizer_state_are_sharded_like_their_kernels(setup, tmp_path):
  from jaxwm.training import sharding  # pylint: disable=g-import-not-at-top
  model, params = setup["model"], setup["params"]
  mesh = sharding.make_mesh(1, 8)
  boxed = jax.eval_shape(lambda k: init_params(model, k, SHAPE, 16), jax.random.key(0))
  base_sh = sharding.param_shardings(boxed, mesh, sharding.DEFAULT_RULES)
  adapter = _random_b(setup["adapter"])
  rep = sharding.replicated(mesh)
  state = {"adapter": adapter, "opt": optax.adam(1e-3).init(adapter)}
  sh = lora.factor_shardings(state, base_sh, rep)
  flat_base = lora.flat_paths(base_sh)
  sharded = 0
  for tree in (sh["adapter"], sh["opt"][0].mu, sh["opt"][0].nu):
    for path, (sa, sb) in lora.factors(tree).items():
      w = tuple(flat_base[path].spec) + (None,) * 3
      nd = len(lora.flat_paths(params)[path].shape)
      assert tuple(sa.spec) == (*w[:nd - 1], None) and tuple(sb.spec) == (*w[:nd - 2], None, w[nd - 1])
      sharded += "fsdp" in str(sa.spec) + str(sb.spec)
  assert sharded > 0  # FSDP splits the factors, not only the base
  assert sh["opt"][0].count == rep
  # Placed on the mesh, the adapter merges to the same weights; load_adapter restores into those shardings.
  placed = jax.device_put(adapter, sh["adapter"])
  sharded_base = jax.device_put(params, base_sh)
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6),  # sharded matmul order
                         lora.merge(sharded_base, placed, SPEC), lora.merge(params, adapter, SPEC))
  adapters.save_adapter(tmp_path / "adapter", placed, SPEC, params)
  loaded, _ = adapters.load_adapter(tmp_path / "adapter", sharded_base)
  jax.tree_util.tree_map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(str(x.sharding)),
                         loaded, sh["adapter"])
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded, adapter)
