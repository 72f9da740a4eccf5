"""Config files list overrides; the model defaults live once, in ``jaxwm.models.config``."""

import dataclasses
import json

import pytest

from configs import encodings, recipe_cpu, repro, small, tiny, wan22_ti2v_5b
from jaxwm.models.config import AttentionConfig, CameraConfig, LociConfig, ModelConfig, default_config_dict

CONFIGS = {"tiny": tiny.get_config, "small": small.get_config, "wan22_ti2v_5b": wan22_ti2v_5b.get_config,
           **{f"repro:{arm}": (lambda arm=arm: repro.get_config(arm)) for arm in repro.ARMS},
           **{f"repro:{arm},w384": (lambda arm=arm: repro.get_config(f"{arm},w384"))
              for arm in repro.ARMS if not arm.startswith("stage")},
           **{f"recipe_cpu:{v}": (lambda v=v: recipe_cpu.get_config(v)) for v in recipe_cpu.VARIANTS},
           **{f"encodings:{arm}": (lambda arm=arm: encodings.get_config(arm)) for arm in encodings.ARMS}}


def _unknown_keys(block, cls, where="model"):
  """Keys of the nested ``block`` that are not fields of dataclass ``cls`` (recursively)."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  bad = []
  for key, value in block.items():
    if key not in fields:
      bad.append(f"{where}.{key}")
    elif dataclasses.is_dataclass(fields[key].default):
      bad += _unknown_keys(value, type(fields[key].default), f"{where}.{key}")
  return bad


def test_default_config_dict_is_the_dataclass_defaults():
  d = default_config_dict()
  assert set(d) == {f.name for f in dataclasses.fields(ModelConfig)}
  assert d["camera"] == dataclasses.asdict(CameraConfig()) and d["loci"] == dataclasses.asdict(LociConfig())
  assert d["attention"] == {f.name: f.default for f in dataclasses.fields(AttentionConfig)}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_model_block_keys_are_fields_and_survive_json(name):
  c = CONFIGS[name]()
  assert not _unknown_keys(c.model, ModelConfig)
  built = ModelConfig.from_dict(c.model)
  # What a checkpoint stores (JSON: tuples become lists) builds the same model.
  assert ModelConfig.from_dict(json.loads(c.to_json())["model"]) == built


def test_tiny_model_is_the_defaults_plus_its_overrides():
  implied = dataclasses.replace(ModelConfig(), dim=192, ffn_dim=384, patch_size=(1, 1, 1),
                                camera=CameraConfig(encoding="worldrope", channels="hw"), loci=LociConfig(blocks=(1, 3)))
  assert ModelConfig.from_dict(tiny.get_config().model) == implied


def test_recipe_default_is_the_measured_run_that_sees():
  c = recipe_cpu.get_config()  # what `--config configs/recipe_cpu.py` builds (RESULTS.md, "The 2-hour recipe that sees")
  t = tiny.get_config()
  assert c.model.to_dict() == t.model.to_dict() and c.recipe.to_dict() == t.recipe.to_dict()
  assert (c.train.num_steps, c.data.num_clips, c.data.clips_per_scene, c.optim.ema_decay) == (5500, 2048, 1, 0.999)
  assert c.train.workdir == "runs/recipe_sees"
  w384 = recipe_cpu.get_config("w384")  # the width-384 run of RESULTS.md's "The CPU recipe"
  assert (w384.model.dim, w384.model.num_heads, w384.model.ffn_dim) == (384, 8, 768)
  assert w384.train.num_steps == 12000 and w384.sample.num_steps <= 10 and w384.data.num_clips == 1024
  assert len({recipe_cpu.get_config(v).train.workdir for v in recipe_cpu.VARIANTS}) == len(recipe_cpu.VARIANTS)
  with pytest.raises(ValueError, match="w999"):
    recipe_cpu.get_config("w999")


@pytest.mark.parametrize("arm", ["rope3d", "gta", "loci", "frame_topk"])
def test_repro_w384_arm_is_the_recipe_plus_one_change(arm):
  """At scale w384 an arm differs from the recipe only in its ingredient (and its schedule length/workdir)."""
  c, base, tiny_arm = repro.get_config(f"{arm},w384"), recipe_cpu.get_config("w384"), repro.get_config(arm)
  assert (c.model.dim, c.optim.lr, c.sample.num_steps, c.data.num_clips) == (
      base.model.dim, base.optim.lr, base.sample.num_steps, base.data.num_clips)
  assert c.train.workdir == f"runs/repro_w384/{arm}" != tiny_arm.train.workdir
  ingredients = ("camera", "attention", "loci")
  for key in ingredients:  # the ingredient is the tiny arm's
    assert c.model[key].to_dict() == tiny_arm.model[key].to_dict()
  assert c.recipe.layout == tiny_arm.recipe.layout
  rest = lambda m: {k: v for k, v in m.to_dict().items() if k not in ingredients}  # noqa: E731
  assert rest(c.model) == rest(base.model)  # everything else is the recipe's
  assert any(c.model[k].to_dict() != base.model[k].to_dict() for k in ingredients) or (
      c.recipe.layout != base.recipe.layout)  # and the arm does change something


@pytest.mark.parametrize("arg,match", [("gta,w999", "scale must be one of"), ("stage2,w384", "tiny' only"),
                                       ("nope", "arm must be one of")])
def test_repro_bad_arm_or_scale_names_it(arg, match):
  with pytest.raises(ValueError, match=match):
    repro.get_config(arg)


@pytest.mark.parametrize("arm", encodings.ARMS)
def test_encoding_arm_is_the_default_plus_its_camera(arm):
  """configs/encodings.py: each arm is the default job with only the camera block (and workdir, no sample) changed."""
  c, base = encodings.get_config(arm), tiny.get_config()
  assert c.model.camera.encoding == ("rope3d" if arm == "plucker" else arm)
  assert c.model.camera.plucker == (arm == "plucker")
  rest = lambda m: {k: v for k, v in m.to_dict().items() if k != "camera"}  # noqa: E731
  assert rest(c.model) == rest(base.model)
  for block in ("data", "recipe", "optim", "sample"):
    assert c[block].to_dict() == base[block].to_dict()
  assert c.train.workdir == f"runs/enc/{arm}" and c.train.sample_every == 0
  built = ModelConfig.from_dict(c.model)
  assert built.camera.channels == ("hw" if arm == "worldrope" else "t_low")
  with pytest.raises(ValueError, match="arm must be one of"):
    encodings.get_config("nope")
