"""The papers' recipes on Wan2.2-TI2V-5B (configs/viewrope_5b.py, loci_5b.py, reworld_5b.py; docs/recipes.md).

Each config passes every check of train.py for a v5p-64 (64 devices) against a fake ingested dataset
(a manifest.json as ``python -m jaxwm.data.ingest`` writes it, no shards), holds the values its paper
states, and builds the 5B backbone plus exactly its paper's extra parameters (abstractly,
``jax.eval_shape``: nothing is allocated). ViewRope's stage commands, as its docstring writes them,
pass the same checks, and stage IV's reaches the last check of train.py itself.
"""

import json
import pathlib
import re
import shlex

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import loci_5b, reworld_5b, viewrope_5b
from jaxwm import config_checks
from jaxwm.training.sharding import mesh_shape
from jaxwm.data import ingest, records
from jaxwm.models.config import ModelConfig
from jaxwm.models.init import init_params
from jaxwm.models.transformer import WanModel

PAPERS = {"viewrope": viewrope_5b, "loci": loci_5b, "reworld": reworld_5b}
DEVICES = 64  # v5p-64 as BENCHMARKS.md counts it (v5p:4x4x4)

# What each paper states (and the jaxwm reading where jaxwm's layout forces one: see the configs).
STATED = {
    "viewrope": {"model.camera.encoding": "viewrope", "model.camera.channels": "t_low",
                 "model.attention.sparsity": "frame_topk", "model.attention.top_k": 5,
                 "model.attention.num_samples": 10, "recipe.layout": "teacher_forcing", "recipe.chunk_size": 1,
                 "data.num_frames": 16, "data.batch_size": 64, "optim.lr": 5e-5, "optim.warmup_steps": 50,
                 "train.num_steps": 6000},
    "loci": {"model.loci.enabled": True, "model.loci.blocks": (2, 4, 6, 7, 8, 9, 11, 13, 14, 16, 23, 24, 25, 27, 28),
             "model.loci.alpha_min": 0.2, "model.loci.init_retention": 0.7, "model.loci.translation_divisor": 6.0,
             "recipe.layout": "diffusion_forcing", "recipe.chunk_size": 5, "recipe.text_dropout": 0.1,
             "data.num_frames": 81, "data.batch_size": 64, "optim.lr": 1e-5, "optim.warmup_steps": 250,
             "optim.end_lr_ratio": 0.1, "optim.weight_decay": 0.0, "optim.grad_clip": 0.3, "train.num_steps": 5000},
    "reworld": {"model.camera.encoding": "mrope", "model.camera.plucker": True, "recipe.layout": "teacher_forcing",
                "recipe.chunk_size": 4, "data.num_frames": 1 + 12 * 4, "recipe.chunk_drop.enabled": True,
                "recipe.chunk_drop.keep": 5, "recipe.head_windows.enabled": True, "recipe.head_windows.window": 12,
                "recipe.head_windows.global_fraction": 0.25, "recipe.head_windows.pool": 12,
                "data.palindrome_prob": 0.2, "data.scale_divisor": 100.0, "sample.guidance": 1.0},
}

# (height, width, RGB frames per clip) of each paper's ingestion: ViewRope App. A.1, LOCI App. A / §4,
# ReWorld §4.1 (480p stage) with 12 chunks of 4 after the first latent.
INGESTED = {"viewrope": (480, 832, 61), "loci": (512, 768, 321), "reworld": (384, 640, 193)}


def _get(config, key):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def write_dataset(path, module, height, width, clip_frames):
  """A dataset folder with the manifest ``python -m jaxwm.data.ingest`` writes for ``module``'s encoders."""
  settings = {"format": ingest.FORMAT, "record_version": records.RECORD_VERSION, "height": height, "width": width,
              "clip_frames": clip_frames, "fps": None, "stride": None, "hop": None, "max_clips_per_video": 0,
              "vae": module.VAE, "temporal_stride": 4, "spatial_stride": 16, "text_encoder": module.TEXT_ENCODER,
              "dtype": "float32"}
  latent_shape = [1 + (clip_frames - 1) // 4, height // 16, width // 16, 48]
  path.mkdir(parents=True, exist_ok=True)
  (path / records.MANIFEST).write_text(json.dumps(
      {"settings": settings, "latent_shape": latent_shape, "shards": [], "done": {}}))
  return latent_shape


def _validated(name, tmp_path):
  module = PAPERS[name]
  h, w, frames = INGESTED[name]
  c = module.get_config()
  latent_shape = write_dataset(tmp_path / "records", module, h, w, frames)
  c.data.data_dir = str(tmp_path / "records")
  notes = config_checks.validate(c, num_devices=DEVICES)
  return c, latent_shape, notes


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_config_passes_every_check_on_a_v5p_64(name, tmp_path):
  c, latent_shape, notes = _validated(name, tmp_path)
  assert c.data.source == "records" and c.data.latent_stride == 16 and c.model.camera.vae_stride == 16
  assert c.model.dtype == "bfloat16" and c.model.remat == "full"
  assert mesh_shape(c, DEVICES) == {"data": 1, "fsdp": DEVICES}  # FSDP over every chip
  assert c.data.batch_size == 64 and "global batch 64" in notes[-1]  # ReWorld: one window per chip (not stated)
  chunk, frames = c.recipe.chunk_size, c.data.num_frames
  assert (frames - 1) % chunk == 0 and frames <= latent_shape[0]  # the first latent + whole chunks, in the clips
  assert latent_shape[1:] == [h // 16 for h in INGESTED[name][:2]] + [48]
  built = ModelConfig.from_dict(c.model)  # what a checkpoint stores (JSON) builds the same model
  assert ModelConfig.from_dict(json.loads(c.to_json())["model"]) == built


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_config_holds_the_stated_values(name, tmp_path):
  c, _, _ = _validated(name, tmp_path)
  for key, want in STATED[name].items():
    got = _get(c, key)
    assert (tuple(got) if isinstance(want, tuple) else got) == want, key
  h, w, frames = INGESTED[name]
  doc = PAPERS[name].__doc__
  assert f"--height {h} --width {w}" in doc and f"--clip_frames {frames}" in doc  # the ingestion command
  assert f"--vae {PAPERS[name].VAE}" in doc and f"--text_encoder {PAPERS[name].TEXT_ENCODER}" in doc


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


def _backbone():
  """Wan2.2-TI2V-5B's transformer in closed form (tests/test_model.py::test_wan22_ti2v_5b_shape)."""
  d, f = 3072, 14336
  per_block = 2 * (4 * (d * d + d) + 2 * d) + (d * f + f) + (f * d + d) + 6 * d + 2 * d
  rest = ((4 * 48 * d + d) + (256 * d + d) + (d * d + d) + (d * 6 * d + 6 * d) + (4096 * d + d) + (d * d + d)
          + 2 * d + (d * 4 * 48 + 4 * 48))
  return 30 * per_block + rest


def _extras(name):
  """The parameters each paper adds to the backbone, in closed form (d = 3072, 24 heads of 128)."""
  d, h, dh = 3072, 24, 128
  if name == "viewrope":  # ViewRope rotates q/k: no parameters; frame sparsity: none
    return 0
  if name == "loci":  # 15 memory branches: q, k, v, out; beta; retention ([mean; first] -> H x Dh/2) and a_h; gate
    return 15 * (4 * (d * d + d) + (d * h + h) + (2 * d * (dh // 2 * h) + dh // 2 * h) + h + d)
  cam = 12  # MRoPE's channels: t_low = [32, 44)
  mrope = (12 * 64 + 64) + (64 * h * dh // 2 + h * dh // 2) + 30 * (cam * dh + h * cam * d)  # pose MLP; W_v, W_p
  plucker = (6 * 2 * 2 * d + d) + (d * d + d)  # Plücker map per 2x2 patch -> silu(Dense) -> zero-init Dense
  return mrope + plucker


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_parameters_are_the_backbone_plus_the_papers_extras(name):
  cfg = ModelConfig.from_dict(PAPERS[name].get_config().model)
  abstract = jax.eval_shape(lambda key: nn.unbox(init_params(WanModel(cfg), key, (1, 2, 4, 4, 48), 64)),
                            jax.random.key(0))
  n = _count(abstract)
  assert n == _backbone() + _extras(name), (n, _backbone(), _extras(name))
  print(f"{name}: {n / 1e9:.3f}B parameters = 5B backbone + {_extras(name) / 1e6:.1f}M")


def _train_commands(doc):
  """``(workdir, {key: value})`` of every ``python train.py`` command of a docstring (continuations joined)."""
  text = re.sub(r"\\\n\s*", " ", doc)
  out = []
  for line in text.splitlines():
    line = line.strip()
    if line.startswith("python train.py --config configs/viewrope_5b.py"):
      args = shlex.split(line)
      workdir = args[args.index("--workdir") + 1]
      out.append((workdir, dict(a[len("--config."):].split("=", 1) for a in args if a.startswith("--config."))))
  return out


def test_viewrope_stage_commands_pass_the_checks(tmp_path):
  """Stages I, II, II', III and IV of the docstring, each against its dataset and with its predecessor's
  workdir present (``train.init_from`` must exist)."""
  write_dataset(tmp_path / "data/viewrope_records", viewrope_5b, 480, 832, 61)
  write_dataset(tmp_path / "data/viewrope_records_201", viewrope_5b, 480, 832, 201)
  commands = _train_commands(viewrope_5b.__doc__)
  assert [w.split("/")[-1] for w, _ in commands] == ["stage1", "stage2", "stage2_61", "stage3", "stage4"]
  seen = {}
  for workdir, overrides in commands:
    c = viewrope_5b.get_config()
    c.data.data_dir = str(tmp_path / c.data.data_dir)
    for key, value in overrides.items():
      if value.startswith("<"):  # "<not stated>": the user's choice
        continue
      old = _get(c, key)
      if key in ("train.init_from", "data.data_dir"):
        value = str(tmp_path / value.replace("$S", "runs/viewrope_5b"))
        (tmp_path / value).mkdir(parents=True, exist_ok=True)
      *path, last = key.split(".")
      node = c
      for p in path:
        node = node[p]
      node[last] = type(old)(value)
    config_checks.validate(c, num_devices=DEVICES)
    seen[workdir.split("/")[-1]] = c
  assert seen["stage1"].model.camera.encoding == "rope3d" and seen["stage2"].model.camera.encoding == "viewrope"
  assert seen["stage1"].data.num_frames == seen["stage2"].data.num_frames == 5  # ~17 RGB frames (§3.4)
  assert seen["stage2_61"].model.attention.sparsity == "dense" and seen["stage2_61"].data.num_frames == 16
  assert seen["stage3"].model.attention.sparsity == "frame_topk" and seen["stage3"].train.num_steps == 6000
  assert seen["stage4"].data.num_frames == 51 and seen["stage4"].train.num_steps == 2000  # 201 frames, 2k steps
  assert seen["stage4"].train.init_from.endswith("runs/viewrope_5b/stage3")


def test_a_stage_command_reaches_train_py_s_last_check(tmp_path, capsys):
  """Stage IV's flags through train.py's own parser: every check passes up to ``train.init_from``, which is
  refused (exit code 2, one line) because stage III's workdir does not exist here; nothing is compiled."""
  from jaxwm.cli.train import cli  # pylint: disable=g-import-not-at-top
  write_dataset(tmp_path / "records_201", viewrope_5b, 480, 832, 201)
  config = pathlib.Path(__file__).resolve().parents[1] / "configs" / "viewrope_5b.py"
  missing = tmp_path / "runs" / "stage3"
  code = cli([f"--config={config}", f"--workdir={tmp_path / 'stage4'}", f"--config.train.init_from={missing}",
              f"--config.data.data_dir={tmp_path / 'records_201'}", "--config.data.num_frames=51",
              "--config.train.num_steps=2000"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err == f"train.py: train.init_from={str(missing)!r}: no such directory or .safetensors file " \
                              "(an earlier stage's workdir, or the Wan transformer's weights)", err
  assert not (tmp_path / "stage4").exists()


@pytest.mark.parametrize("key", ["train.sample_every", "train.gain_every"])
def test_records_refuse_the_procedural_probes(key, tmp_path):
  module = PAPERS["viewrope"]
  h, w, frames = INGESTED["viewrope"]
  c = module.get_config()
  write_dataset(tmp_path / "records", module, h, w, frames)
  c.data.data_dir = str(tmp_path / "records")
  section, name = key.split(".")
  c[section][name] = 100
  with pytest.raises(config_checks.ConfigError, match=f"{key}=100: must be 0 with data.source='records'"):
    config_checks.validate(c, num_devices=DEVICES)


@pytest.fixture(scope="module")
def smoke_records(tmp_path_factory):
  """The smoke variants' stand-in footage (``python -m jaxwm.data.procedural --export``) ingested with the
  built-in tiny encoders, as configs/_smoke.py's commands do (32x32 pixels here: 2x2 latents, faster)."""
  from configs import _smoke  # pylint: disable=g-import-not-at-top
  from jaxwm.data.procedural.export import export  # pylint: disable=g-import-not-at-top
  d = tmp_path_factory.mktemp("smoke")
  export(d / "in", clips=2, frames=41, size=(32, 32))
  summary = ingest.ingest(d / "in" / "videos", d / "records", height=32, width=32, clip_frames=41,
                          cameras=d / "in" / "cameras", captions=d / "in" / "captions.jsonl",
                          encoder=ingest.make_encoder(_smoke.VAE), text_encoder=ingest.make_text_encoder(
                              _smoke.TEXT_ENCODER), progress=False)
  assert summary["new_clips"] == 2 and summary["rejected"] == 0
  return d


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PAPERS))
def test_smoke_variant_trains_on_cpu(name, smoke_records, tmp_path):
  """``configs/<paper>_5b.py:smoke``: the recipe's code path (records with VAE latents and text, its encoding,
  sparsity, memory, layout and masks) trains on the CPU; only sizes, steps and kernels differ from the recipe."""
  from jaxwm import tasks  # pylint: disable=g-import-not-at-top
  module = PAPERS[name]
  full, c = module.get_config(), module.get_config("smoke")
  c.data.data_dir = str(smoke_records / "records")
  c.train.update(num_steps=2, ckpt_every=2, log_every=1)
  config_checks.validate(c, num_devices=2)
  kept = ["model.camera.encoding", "model.camera.plucker", "model.attention.sparsity", "model.loci.enabled",
          "recipe.layout", "recipe.chunk_size", "recipe.chunk_drop.enabled", "recipe.head_windows.enabled",
          "recipe.text_dropout", "data.source", "data.palindrome_prob", "data.scale_divisor", "optim.lr",
          "model.remat", "mesh.fsdp"]
  assert {k: _get(c, k) for k in kept} == {k: _get(full, k) for k in kept}
  assert c.train.workdir == f"runs/{module.__name__.split('.')[-1]}_smoke"
  from jaxwm.training import sharding as sh  # pylint: disable=g-import-not-at-top
  mesh = sh.make_mesh(1, 2, jax.devices()[:2])  # the recipe's FSDP mesh over 2 devices: parameters and batch split
  _, history = tasks.run(c, tmp_path / "run", mesh=mesh, progress=False)
  assert len(history) == 2 and all(np.isfinite(history))
  with pytest.raises(ValueError, match="not one of"):
    module.get_config("tiny")


def test_distill_config_takes_a_variant():
  from configs import distill  # pylint: disable=g-import-not-at-top
  c = distill.get_config("viewrope_5b:smoke")
  assert c.train.task == "distill" and c.train.workdir == "runs/viewrope_5b_smoke_distill"
  assert c.model.dim == viewrope_5b.get_config("smoke").model.dim == 64
  assert distill.get_config().train.workdir == "runs/tiny_distill"
