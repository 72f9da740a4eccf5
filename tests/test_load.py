"""Params-only loading (``jaxwm.sampling.load``): a checkpoint written on an 8-device FSDP mesh restores
into one device, reading the parameters (or their EMA) and nothing else of the train state."""

import jax
import numpy as np
import pytest
from conftest import tiny_config
from orbax.checkpoint import type_handlers

from jaxwm.checkpoint import Checkpointer
from jaxwm.models.config import ModelConfig
from jaxwm.sampling.load import load_model
from jaxwm.training import sharding as sh
from jaxwm.training.loop import Trainer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """``(config, host state)`` with checkpoints under ``with_ema/`` (step 3; ema = params + 1) and
  ``no_ema/`` (step 5; ema off), written from an 8-device ``fsdp`` mesh."""
  root = tmp_path_factory.mktemp("load")
  c = tiny_config(**{"optim.ema_decay": 0.9})
  tr = Trainer(c, root, mesh=sh.make_mesh(1, 8))
  state = tr.init_state()
  assert any(not x.sharding.is_fully_replicated for x in jax.tree_util.tree_leaves(state.params))
  state = state.replace(ema=jax.tree_util.tree_map(lambda x: x + 1, state.params))
  for name, step, st in (("with_ema", 3, state), ("no_ema", 5, state.replace(ema={}))):
    ck = Checkpointer(root / name / "checkpoints", async_save=False)
    ck.save(step, st, config=c)
    ck.close()
  return root, c, jax.device_get(state)


@pytest.fixture
def reads(monkeypatch):
  """Names of the arrays Orbax deserializes (``params.blocks...``, ``opt_state...``) during a test."""
  names = []
  for handler in (type_handlers.ArrayHandler, type_handlers.NumpyHandler, type_handlers.ScalarHandler):
    orig = handler.deserialize

    async def spy(self, infos, args=None, orig=orig):
      names.extend(i.name for i in infos)
      return await orig(self, infos, args)

    monkeypatch.setattr(handler, "deserialize", spy)
  return names


def _names(prefix, tree):
  """Orbax's names of ``tree``'s arrays saved under field ``prefix`` (``params.blocks.ffn_in.kernel``)."""
  return {".".join([prefix, *(str(k.key) for k in kp)]) for kp, _ in jax.tree_util.tree_leaves_with_path(tree)}


def _assert_equal(got, want):
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(got), want)


def test_fsdp_checkpoint_restores_params_only_into_one_device(saved, reads):
  root, c, state = saved
  config, model, variables, step = load_model(root / "with_ema", use_ema=False)
  assert step == 3 and set(variables) == {"params"} and config.data.to_dict() == c.data.to_dict()
  assert model.cfg == ModelConfig.from_dict(c.model)
  _assert_equal(variables["params"], state.params)
  for leaf in jax.tree_util.tree_leaves(variables["params"]):
    assert leaf.sharding.device_set == {jax.devices()[0]} and leaf.sharding.is_fully_replicated
  # Exactly the parameter arrays were read: no optimizer state, EMA, step or routing.
  assert set(reads) == _names("params", state.params), sorted(set(reads) ^ _names("params", state.params))[:5]
  assert jax.tree_util.tree_leaves(state.opt_state) and not any(n.startswith("opt_state") for n in reads)
  # The spy sees other fields when they are asked for.
  reads.clear()
  ck = Checkpointer(root / "with_ema" / "checkpoints", async_save=False)
  rep = jax.tree_util.tree_leaves(variables["params"])[0].sharding
  assert int(ck.restore_fields({"step": jax.ShapeDtypeStruct((), np.int32, sharding=rep)}, 3)["step"]) == 0
  ck.close()
  assert reads == ["step"]


def test_use_ema_picks_the_ema_when_kept(saved, reads):
  root, _, state = saved
  _, _, variables, _ = load_model(root / "with_ema")
  _assert_equal(variables["params"], state.ema)
  assert set(reads) == _names("ema", state.ema)
  reads.clear()
  _, _, variables, step = load_model(root / "no_ema" / "checkpoints" / "5")  # ema off: the params
  assert step == 5
  _assert_equal(variables["params"], state.params)
  assert set(reads) == _names("params", state.params)


def test_mesh_argument_replicates_over_it(saved):
  root, _, state = saved
  mesh = sh.make_mesh(2, 1, jax.devices()[:2])
  _, _, variables, _ = load_model(root / "no_ema", mesh=mesh)
  leaf = jax.tree_util.tree_leaves(variables["params"])[0]
  assert leaf.sharding.device_set == set(jax.devices()[:2]) and leaf.sharding.is_fully_replicated
  _assert_equal(variables["params"], state.params)


def test_parameter_tree_unlike_its_config_names_the_parameter(saved, tmp_path):
  _, c, state = saved
  wrong = tiny_config(**{"model.ffn_dim": 2 * c.model.ffn_dim})  # not the model these parameters belong to
  ck = Checkpointer(tmp_path / "checkpoints", async_save=False)
  ck.save(1, state, config=wrong)
  ck.close()
  msg = r"step 1 \(ema\): parameter blocks/ffn_in/bias has shape \(2, 64\), the model's is \(2, 128\)"
  with pytest.raises(ValueError, match=msg) as e:
    load_model(tmp_path)
  assert "\n" not in str(e.value)


def test_missing_checkpoint_says_how_to_make_one(saved, tmp_path):
  with pytest.raises(FileNotFoundError, match="python train.py"):
    load_model(tmp_path / "nothing")
  with pytest.raises(FileNotFoundError, match=r"step=4: no such checkpoint .* steps: \[3\]"):
    load_model(saved[0] / "with_ema", step=4)


def test_loci_checkpoint_with_one_layer_stack_restores_into_grouped_layers(tmp_path):
  """LOCI checkpoints written before layers were grouped (one ``blocks`` stack, memory in every layer)."""
  from jaxwm.models.layer_stacks import join_layers  # pylint: disable=g-import-not-at-top
  from jaxwm.training.step import TrainState  # pylint: disable=g-import-not-at-top
  c = tiny_config(**{"model.loci.enabled": True, "model.loci.blocks": (1,)})
  tr = Trainer(c, tmp_path, mesh=sh.make_mesh(1, 1, jax.devices()[:1]))
  params = jax.device_get(tr.init_state().params)
  assert sorted(k for k in params if k.startswith("blocks")) == ["blocks_0_1", "blocks_1_2"]
  old = join_layers(params, tr.model_cfg)
  hybrid = params["blocks_1_2"]
  rng = np.random.default_rng(0)
  for k in ("memory", "mem_gate"):  # layer 0 carried (unused) memory parameters too
    old["blocks"][k] = jax.tree_util.tree_map(
        lambda a: np.concatenate([rng.normal(size=a.shape).astype(a.dtype), a]), hybrid[k])
  ck = Checkpointer(tmp_path / "old" / "checkpoints", async_save=False)
  ck.save(7, TrainState(step=np.int32(7), params=old, opt_state={}, ema={}, routing={}), config=c)
  ck.close()
  _, model, variables, step = load_model(tmp_path / "old")
  assert step == 7 and model.cfg.layer_groups == (("softmax", 0, 1), ("hybrid", 1, 2))
  _assert_equal(variables["params"], params)
