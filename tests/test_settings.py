"""The config schema (:mod:`jaxwm.settings`): every block a frozen dataclass with its defaults, checks and resume
rules; unknown keys refused with suggestions; configs built from the defaults; a new key is one field line."""

import dataclasses

import pytest
from test_configs import CONFIGS

from jaxwm import config_checks, settings
from jaxwm.blocks import BLOCKS
from jaxwm.distill.loop import DistillConfig
from jaxwm.settings import ConfigError, Float, setting
from jaxwm.training import resume
from jaxwm.training.recipe import RecipeConfig

ALL = {**BLOCKS, "distill": DistillConfig}


def _leaves(cls, prefix):
  for f in dataclasses.fields(cls):
    d = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if dataclasses.is_dataclass(d):
      yield from _leaves(type(d), f"{prefix}.{f.name}")
    else:
      yield f"{prefix}.{f.name}", f


@pytest.mark.parametrize("prefix", sorted(ALL))
def test_every_block_parses_its_defaults_and_documents_and_checks_every_field(prefix, tmp_path):
  cls = ALL[prefix]
  need = {"teacher": str(tmp_path)} if prefix == "distill" else {}  # required: the teacher's workdir
  assert cls.from_dict({**settings.defaults(cls), **need}) == cls(**need) == cls.from_dict(need)
  assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
  for key, f in _leaves(cls, prefix):
    assert f.metadata.get("check") is not None, f"{key} has no check"
    assert f.metadata["resume"] in settings.RESUME, key
  doc = " ".join((c.__doc__ or "") for c in [cls] + [type(f.default_factory()) for f in dataclasses.fields(cls)
                                                     if f.default_factory is not dataclasses.MISSING])
  for f in dataclasses.fields(cls):
    assert f.name in doc, f"{prefix}.{f.name} is not documented in {cls.__name__}"


def test_configs_start_from_the_block_defaults():
  c = CONFIGS["tiny"]()
  for prefix, cls in BLOCKS.items():
    assert c[prefix].to_dict() == settings.defaults(cls), prefix  # tiny trains with the defaults as they are


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_shipped_config_parses(name):
  c = CONFIGS[name]()
  for prefix, cls in BLOCKS.items():
    cls.from_dict(c[prefix])


@pytest.mark.parametrize("prefix,key,value,match", [
    ("optim", "lrr", 1e-3, r"optim.lrr=0.001: no such key in optim; did you mean 'lr'\?"),
    ("recipe", "layuot", "x", r"recipe.layuot='x': no such key in recipe; did you mean 'layout'\?"),
    ("train", "zzz", 1, r"train.zzz=1: no such key in train; keys: async_checkpoint, ckpt_every"),
    ("optim", "lr", -1.0, r"optim.lr=-1.0: must be a finite learning rate > 0"),
    ("recipe", "layout", "tf", r"recipe.layout='tf': must be one of 'teacher_forcing', 'diffusion_forcing'"),
    ("data", "source", "disk", r"data.source='disk': must be one of 'tfds', 'procedural', 'records'"),
    ("mesh", "data", 0, r"mesh.data=0: must be an integer >= 1, or -1 for the remaining devices"),
    ("train", "keep", True, r"train.keep=True: must be an integer >= 1 \(checkpoints kept"),
    ("sample", "noise_scale", -0.5, r"sample.noise_scale=-0.5: must be "),
])
def test_a_bad_key_or_value_is_one_line_naming_it(prefix, key, value, match):
  c = CONFIGS["tiny"]()
  with c[prefix].unlocked():
    c[prefix][key] = value
  with pytest.raises(ConfigError, match=match) as e:
    config_checks.validate(c)
  assert "\n" not in str(e.value)


def test_nested_blocks_and_top_level_keys_are_checked_too():
  c = CONFIGS["tiny"]()
  with c.recipe.head_windows.unlocked():
    c.recipe.head_windows.windw = 3
  with pytest.raises(ConfigError, match=r"recipe.head_windows.windw=3: no such key in recipe.head_windows; "
                                        r"did you mean 'window'\?"):
    config_checks.validate(c)
  c = CONFIGS["tiny"]()
  with c.unlocked():
    c.optimm = {}
  with pytest.raises(ConfigError, match=r"optimm=.*did you mean 'optim'\?"):
    config_checks.validate(c)


def test_resume_rules_are_field_metadata():
  rules = resume.resume_rules()
  assert rules["data.image_size"] == rules["data.latent_stride"] == rules["recipe.head_windows.enabled"] == "refused"
  assert rules["model.dim"] == rules["model.camera.encoding"] == "refused"
  assert rules["model.remat"] == rules["model.attention.impl"] == rules["model.loci.chunk_size"] == "logged"
  assert rules["optim.lr"] == rules["train.num_steps"] == rules["recipe.layout"] == rules["seed"] == "logged"
  assert rules["train.log_every"] == rules["sample.num_steps"] == rules["mesh.fsdp"] == "free"
  c = CONFIGS["tiny"]()
  saved = c.to_dict()
  c.sample.num_steps, c.recipe.layout, c.recipe.head_windows.enabled = 10, "teacher_forcing", True
  refused, logged = resume.resume_config_differences(saved, c)
  assert [k for k, _, _ in refused] == ["recipe.head_windows.enabled"]
  assert [k for k, _, _ in logged] == ["recipe.layout"]


def test_a_saved_config_without_a_newer_key_reads_as_it_meant():
  """Keys added after checkpoints were written without them (``absent``): the layout was teacher forcing and the
  timesteps uniform then; a run config without them gets today's defaults."""
  old = {"chunk_size": 2, "timestep_shift": 1.0}
  assert RecipeConfig.from_dict(old, legacy=True).layout == "teacher_forcing"
  assert RecipeConfig.from_dict(old, legacy=True).timestep_distribution == "uniform"
  assert RecipeConfig.from_dict(old).layout == "diffusion_forcing"
  from jaxwm.data.sources import data_of  # pylint: disable=g-import-not-at-top
  assert data_of({"latent_stride": 8}).autoencoder == "space_to_depth:8"
  assert data_of({}).palindrome_prob == 0.0


def test_absent_filled_agrees_with_the_legacy_parse_and_checks_nothing():
  old = {"chunk_size": 2, "timestep_shift": 1.0}
  assert settings.absent_filled(RecipeConfig, old) == RecipeConfig.from_dict(old, legacy=True).to_dict()
  # The saved values are kept as they are, unchecked (a teacher directory may have moved since).
  saved = {"teacher": "/no/such/dir", "rank": 8}
  filled = settings.absent_filled(DistillConfig, saved)
  assert filled["teacher"] == "/no/such/dir" and filled["rank"] == 8 and filled["targets"] == "blocks"
  assert set(filled) == {f.name for f in dataclasses.fields(DistillConfig)} and saved == {"teacher": "/no/such/dir",
                                                                                         "rank": 8}


def test_a_new_recipe_key_is_one_field_line():
  """One line gives a key its default, check, resume rule and place in the defaults configs start from."""

  @dataclasses.dataclass(frozen=True)
  class Recipe(RecipeConfig):
    noise_floor: float = setting(0.0, Float(ge=0, le=1))  # the one line

  assert settings.defaults(Recipe)["noise_floor"] == 0.0
  assert Recipe.from_dict({"noise_floor": 0.5}).noise_floor == 0.5
  assert settings.resume_rules(Recipe)["recipe.noise_floor"] == "logged"
  with pytest.raises(ConfigError, match=r"recipe.noise_floor=2: must be >= 0 and <= 1"):
    Recipe.from_dict({"noise_floor": 2})
  with pytest.raises(ConfigError, match=r"did you mean 'noise_floor'"):
    Recipe.from_dict({"noise_flor": 0.1})


def test_choices_come_from_the_registries(monkeypatch):
  from jaxwm import tasks  # pylint: disable=g-import-not-at-top
  from jaxwm.training.runner import TrainConfig  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match="train.task='count': must be one of 'diffusion', 'distill'"):
    TrainConfig.from_dict({"task": "count"})
  monkeypatch.setitem(tasks.TASKS, "count", tasks.TaskEntry("counting_task"))
  assert TrainConfig.from_dict({"task": "count"}).task == "count"


def test_what_is_checked_is_what_runs():
  """A block key the config lacks is written in with its default (and said), so the checks and the run read the
  same value; a required key (the distillation teacher) is refused when absent, not filled."""
  c = CONFIGS["tiny"]()
  del c.data["per_device_batch_size"]
  del c.train["task"]
  notes = config_checks.validate(c, num_devices=1)
  assert c.data.per_device_batch_size == 4 and c.train.task == "diffusion" and c.data.batch_size == 4
  assert "data.per_device_batch_size not set: 4 (the default)" in notes
  with pytest.raises(ConfigError, match="distill.teacher='': pass the teacher's training workdir"):
    DistillConfig.from_dict({"rank": 4})


def test_distillation_refuses_a_regression_to_a_guided_teacher(tmp_path):
  """The ODE-regression targets are the unguided teacher's samples: a guided distillation with a regression term
  is refused in one line naming the key, and each setting alone passes the block's checks."""
  from configs import distill  # pylint: disable=g-import-not-at-top
  from jaxwm.distill.loop import DistillConfigError, check_distill  # pylint: disable=g-import-not-at-top
  c = distill.get_config()
  c.distill.teacher = str(tmp_path)
  c.distill.regression_weight = 2.0
  check_distill(c)
  c.model.cross_attn = True
  c.distill.guidance = 3.0
  with pytest.raises(DistillConfigError, match=r"^distill.regression_weight=2.0: must be 0 with distill.guidance "):
    check_distill(c)
  c.distill.regression_weight = 0.0
  check_distill(c)
  c.distill.regression_steps = 0
  with pytest.raises(DistillConfigError, match="distill.regression_steps=0: "):
    check_distill(c)
  c.distill.regression_steps = 10
  for key, bad in (("gan_weight", -0.1), ("gan_critic_weight", -1.0), ("lr_disc", 0.0), ("noise_scale", 0.0)):
    good, c.distill[key] = c.distill[key], bad
    with pytest.raises(DistillConfigError, match=f"^distill.{key}={bad}: must be"):
      check_distill(c)
    c.distill[key] = good
  check_distill(c)


def test_a_resume_compares_what_saved_keys_meant():
  """A checkpoint saved before ``recipe.layout`` existed trained with teacher forcing: resuming it with the default
  says so, and a resume that keeps it says nothing."""
  c = CONFIGS["tiny"]()
  saved = c.to_dict()
  del saved["recipe"]["layout"]
  assert resume.resume_config_differences(saved, c) == ([], [("recipe.layout", "teacher_forcing",
                                                               "diffusion_forcing")])
  c.recipe.layout = "teacher_forcing"
  assert resume.resume_config_differences(saved, c) == ([], [])
