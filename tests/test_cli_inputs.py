"""Every bad input of ``train.py``, ``sample.py`` and the loop-closure CLI is refused in one line with its
value, exit code 2, and nothing written (the table is the list of what is validated); outputs never
replace earlier ones; the default config trains on 1, 2, 4 and 8 devices.

The CLIs run in this process (``train.cli``, ``sample.main``, ``loop_closure.main``) from a scratch
working directory, so anything a refusal might create (a workdir, ``samples/``, ``data/``) would show
in the snapshot of that directory.
"""

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.py")
# The default config at test sizes (16x16 procedural frames, 5 frames, a 2-layer model, 1 step).
SMALL = ["--config.data.source=procedural", "--config.data.num_clips=8", "--config.data.clip_frames=9",
         "--config.data.render_size=16", "--config.data.image_size=16", "--config.data.num_frames=5",
         "--config.model.dim=64", "--config.model.num_heads=2", "--config.model.num_layers=2",
         "--config.model.ffn_dim=64", "--config.model.freq_dim=32", "--config.model.text_dim=16",
         "--config.train.num_steps=1", "--config.train.sample_every=0", "--config.train.gain_every=0", "--config.train.async_checkpoint=False",
         "--config.optim.warmup_steps=0"]


def snapshot(*roots):
  """Every path under ``roots`` with its kind, size and modification time."""
  out = {}
  for root in roots:
    root = pathlib.Path(root)
    for p in [root, *sorted(root.rglob("*"))]:
      st = p.stat()
      out[str(p)] = (p.is_dir(), 0 if p.is_dir() else st.st_size, st.st_mtime_ns)
  return out


def refused(capsys, code, *expected):
  """Exit code 2, one line on stderr naming every ``expected`` piece, no traceback."""
  err = capsys.readouterr().err.strip()
  assert code == 2, err
  assert len(err.splitlines()) == 1 and "Traceback" not in err, err
  for piece in expected:
    assert piece in err, (piece, err)
  return err


# ------------------------------------------------------------------------------------------------------------
# train.py

TRAIN_BAD = [
    # optim
    ("--config.optim.lr=-1e-3", ["optim.lr=-0.001", "> 0"]),
    ("--config.optim.lr=0", ["optim.lr=0"]),
    ("--config.optim.lr=nan", ["optim.lr=nan"]),
    ("--config.optim.lr=inf", ["optim.lr=inf"]),
    ("--config.optim.lr=abc", ["abc"]),
    ("--config.optim.warmup_steps=-10", ["optim.warmup_steps=-10", ">= 0"]),
    ("--config.optim.end_lr_ratio=-1", ["optim.end_lr_ratio=-1"]),
    ("--config.optim.weight_decay=-0.1", ["optim.weight_decay=-0.1"]),
    ("--config.optim.b1=1.0", ["optim.b1=1.0"]),
    ("--config.optim.b2=-0.5", ["optim.b2=-0.5"]),
    ("--config.optim.eps=0", ["optim.eps=0"]),
    ("--config.optim.grad_clip=-1", ["optim.grad_clip=-1"]),
    ("--config.optim.ema_decay=1.0", ["optim.ema_decay=1.0"]),
    # train
    ("--config.train.num_steps=0", ["train.num_steps=0", ">= 1"]),
    ("--config.train.num_steps=-5", ["train.num_steps=-5"]),
    ("--config.train.num_steps=1.5", ["1.5"]),
    ("--config.train.log_every=0", ["train.log_every=0"]),
    ("--config.train.ckpt_every=0", ["train.ckpt_every=0"]),
    ("--config.train.keep=0", ["train.keep=0", ">= 1"]),
    ("--config.train.sample_every=-1", ["train.sample_every=-1"]),
    ("--config.train.init_from=/nonexistent/stage1", ["train.init_from='/nonexistent/stage1'"]),
    ("--config.train.lr=1", ["train.lr"]),  # unknown key
    ("--config.seed=-1", ["seed=-1"]),
    ("--config.seed=4294967296", ["seed=4294967296"]),
    # data
    ("--config.data.source=imagenet", ["data.source='imagenet'"]),
    ("--config.data.num_clips=0", ["data.num_clips=0"]),
    ("--config.data.clips_per_scene=0", ["data.clips_per_scene=0"]),
    ("--config.data.render_size=0", ["data.render_size=0"]),
    ("--config.data.image_size=30", ["data.image_size=30", "data.render_size=64"]),
    ("--config.data.latent_stride=3", ["data.image_size=32", "data.latent_stride=3"]),
    ("--config.data.latent_stride=0", ["data.latent_stride=0"]),
    ("--config.data.num_frames=8", ["data.num_frames=8", "1 + k * recipe.chunk_size=2"]),
    ("--config.data.num_frames=1", ["data.num_frames=1"]),
    ("--config.data.frame_stride=0", ["data.frame_stride=0"]),
    ("--config.data.clip_frames=5", ["data.clip_frames=5", ">= 17"]),
    ("--config.data.batch_size=-1", ["data.batch_size=-1"]),
    ("--config.data.per_device_batch_size=-2", ["data.per_device_batch_size=-2"]),
    ("--config.data.per_device_batch_size=0", ["data.batch_size=0", "data.per_device_batch_size"]),
    # 8 devices here: an explicit batch that does not divide the data axis, refused before the dataset
    ("--config.data.batch_size=4", ["data.batch_size=4", "multiple of 8", "data=8", "16, 24"]),
    ("--config.data.batch_size=12", ["data.batch_size=12", "multiple of 8"]),
    ("--config.data.worker_count=-1", ["data.worker_count=-1"]),
    ("--config.data.read_ahead=0", ["data.read_ahead=0"]),
    ("--config.data.palindrome_prob=1.5", ["data.palindrome_prob=1.5"]),
    ("--config.data.scale_divisor=0", ["data.scale_divisor=0"]),
    ("--config.data.convention=blender", ["data.convention='blender'"]),
    # recipe
    ("--config.recipe.chunk_size=0", ["recipe.chunk_size=0"]),
    ("--config.recipe.layout=autoregressive", ["recipe.layout='autoregressive'"]),
    ("--config.recipe.timestep_distribution=beta", ["recipe.timestep_distribution='beta'"]),
    ("--config.recipe.timestep_shift=0", ["recipe.timestep_shift=0"]),
    ("--config.recipe.chunk_drop.keep=-1", ["recipe.chunk_drop.keep=-1"]),
    ("--config.recipe.head_windows.window=0", ["recipe.head_windows.window=0"]),
    ("--config.recipe.head_windows.global_fraction=0", ["recipe.head_windows.global_fraction=0"]),
    ("--config.recipe.head_windows.pool=0", ["recipe.head_windows.pool=0"]),
    # sample
    ("--config.sample.num_steps=0", ["sample.num_steps=0"]),
    ("--config.sample.shift=-1", ["sample.shift=-1"]),
    # mesh (8 devices)
    ("--config.mesh.data=3", ["mesh.data=3", "[1, 2, 4, 8]"]),
    ("--config.mesh.fsdp=0", ["mesh.fsdp=0"]),
    ("--config.mesh.fsdp=-1", ["mesh.fsdp=-1", "at most one"]),
    ("--config.mesh.data=2 --config.mesh.fsdp=2", ["mesh.data=2", "needs 4 devices; 8 available"]),
    # model: ModelConfig's own checks, and the ones tying it to the data
    ("--config.model.num_heads=5", ["model.num_heads=5"]),
    ("--config.model.camera.encoding=nerf", ["'nerf'"]),
    ("--config.model.camera.channels=[[0,7]]", ["[0, 7)", "not a multiple of 2", "'worldrope'"]),
    ("--config.model.camera.encoding=viewrope --config.model.camera.channels=[[0,7]]",
     ["[0, 7)", "not a multiple of 3", "'viewrope'"]),
    ("--config.model.camera.channels=[[0,7]", ["model.camera.channels='[[0,7]'", "not a Python/JSON list"]),
    ("--config.model.camera.channels=[0,12]", ["model.camera.channels=[0,12]", "[start, end)"]),
    ("--config.model.camera.channels=t_hi", ["'t_hi'"]),
    ("--config.model.camera.vae_stride=8", ["model.camera.vae_stride=8", "data.latent_stride=4"]),
    ("--config.model.attention.top_k=0", ["model.attention.top_k"]),
    ("--config.model.attention.sparsity=random", ["'random'"]),
    ("--config.model.loci.enabled=True --config.model.loci.blocks=[1,7]", ["model.loci.blocks", "7"]),
    ("--config.model.patch_size=(1,3,3)", ["model.patch_size=[1,3,3]", "8 latent pixels"]),
    ("--config.model.out_channels=12", ["model.out_channels=12", "48"]),
    ("--config.model.remat=always", ["'always'"]),
    # the command line itself
    ("--config.optim.lrr=1", ["optim.lrr", "did you mean optim.lr"]),
    ("--config=configs/nope.py", ["nope.py"]),
    ("--nosuchflag=1", ["nosuchflag"]),
    ("stray", ["'stray'"]),
]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
  """An empty working directory (relative outputs land here)."""
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  return cwd


def test_train_refuses_bad_inputs(scratch, capsys):
  import train  # pylint: disable=g-import-not-at-top
  before = snapshot(scratch)
  for args, expected in TRAIN_BAD:
    argv = args.split()
    if not any(a.startswith("--config=") for a in argv):
      argv = [f"--config={TINY}", *argv]
    code = train.cli([*argv, "--workdir=w"])
    err = refused(capsys, code, *expected)
    assert err.startswith("train.py: "), err
    assert snapshot(scratch) == before, args


def test_train_refusal_as_a_process(tmp_path):
  """The real entry point: exit code 2, one line, no traceback, no workdir."""
  r = subprocess.run([sys.executable, "train.py", "--config.optim.lr=-1e-3", f"--workdir={tmp_path / 'w'}"],
                     cwd=ROOT, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=False)
  assert r.returncode == 2, r.stderr
  assert r.stderr.strip() == "train.py: optim.lr=-0.001: must be a finite learning rate > 0"
  assert not (tmp_path / "w").exists()


def test_command_line_lists_reach_the_range_checks():
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from jaxwm import config_checks  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  c.lock()
  c.model.camera.channels = "[[36, 48]]"  # as --config.model.camera.channels='[[36, 48]]' arrives
  notes = config_checks.validate(c, num_devices=1)
  assert c.model.camera.channels == ((36, 48),) and ModelConfig.from_dict(c.model).camera.channels == ((36, 48),)
  assert any("model.camera.channels parsed" in n for n in notes)
  assert json.loads(c.to_json())["model"]["camera"]["channels"] == [[36, 48]]  # what a checkpoint stores


def test_tiny_config_and_every_shipped_config_pass():
  from configs import repro, small, tiny, wan22_ti2v_5b  # pylint: disable=g-import-not-at-top
  from jaxwm import config_checks  # pylint: disable=g-import-not-at-top
  for make in [tiny.get_config, small.get_config, wan22_ti2v_5b.get_config] + [
      (lambda arm=arm: repro.get_config(arm + scale)) for arm in repro.ARMS if not arm.startswith("stage")
      for scale in ("", ",w384")]:
    c = make()
    config_checks.validate(c, num_devices=8)
    assert c.data.batch_size == 32


def _train_config(n):
  """The default config at test sizes (the overrides of ``SMALL``) with its global batch for ``n`` devices."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from jaxwm import config_checks  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  for arg in SMALL:
    key, value = arg[len("--config."):].split("=")
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = type(node[last])(value == "True" if isinstance(node[last], bool) else value)
  notes = config_checks.validate(c, num_devices=n)
  return c, notes


@pytest.mark.parametrize("n", [1, 4])  # and 8: test_default_train_py_on_8_devices
def test_default_config_trains_on_n_devices(n, tmp_path):
  from jaxwm.training import sharding  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import run  # pylint: disable=g-import-not-at-top
  c, notes = _train_config(n)
  assert c.data.batch_size == 4 * n and f"x {n}" in notes[-1]
  mesh = sharding.make_mesh(c.mesh.data, c.mesh.fsdp, jax.devices()[:n])
  _, history = run(c, tmp_path, mesh=mesh, progress=False)
  assert len(history) == 1 and math.isfinite(history[0])


def test_default_train_py_on_8_devices(scratch, capsys):
  """``python train.py`` (the default config at test sizes) on the 8 fake devices: batch 4 per device."""
  import train  # pylint: disable=g-import-not-at-top
  assert jax.device_count() == 8
  assert train.cli([f"--config={TINY}", *SMALL, "--workdir=w"]) == 0
  out = capsys.readouterr().out
  assert "global batch 32 = data.per_device_batch_size 4 x 8" in out
  assert (scratch / "w" / "checkpoints" / "1").is_dir()


# ------------------------------------------------------------------------------------------------------------
# sample.py

RE10K_LINE = "{t} 0.8 0.8 0.5 0.5 0 0 1 0 0 {x} 0 1 0 0 0 0 1 0\n"


def _trajectory(path, n):
  path.write_text("https://example.com/video\n" + "".join(RE10K_LINE.format(t=i, x=0.05 * i) for i in range(n)))
  return path


@pytest.fixture
def sample_inputs(scratch):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  Image.fromarray(np.full((24, 24, 3), 128, np.uint8)).save(scratch / "first.png")
  (scratch / "notes.png").write_text("not an image")
  _trajectory(scratch / "cams.txt", 7)
  _trajectory(scratch / "short.txt", 2)
  (scratch / "garbage.txt").write_text("header\n1 2 3\n")
  (scratch / "taken.gif").write_bytes(b"GIF89a")
  (scratch / "half.json").write_text("{}")
  return scratch


SAMPLE_BAD = [
    ("--frames 0", ["--frames=0"]),
    ("--frames -1", ["--frames=-1"]),
    ("--frames 4", ["--frames=4", "1 + k * 2"]),  # checked against the checkpoint's chunk size
    ("--frames abc", ["'abc'"]),
    ("--steps 0", ["--steps=0"]),
    ("--steps -2", ["--steps=-2"]),
    ("--shift 0", ["--shift=0"]),
    ("--shift nan", ["--shift=nan"]),
    ("--noise-scale 0", ["--noise-scale=0"]),
    ("--noise-scale -1", ["--noise-scale=-1"]),
    ("--clip -1", ["--clip=-1"]),
    ("--window 0 --memory window", ["--window=0"]),
    ("--window 4", ["--window=4", "--memory window only"]),
    ("--memory everything", ["'everything'"]),
    ("--seed -1", ["--seed=-1"]),
    ("--seed 4294967296", ["--seed=4294967296"]),
    ("--step -1", ["--step=-1"]),
    ("--step 99", ["step=99", "steps: [2]"]),
    ("--out a.png", ["--out='a.png'", ".gif or .mp4"]),
    ("--out taken.gif", ["--out='taken.gif'", "--overwrite"]),
    ("--out half.gif", ["--out='half.gif'", "half.json exists"]),
    ("--out .", ["--out='.'"]),
    ("--preset yaw90", ["--image"]),
    ("--image first.png --family walks", ["--family='walks'", "--image brings its own first frame"]),
    ("--image first.png --preset spin90", ["--preset='spin90'", "unknown preset"]),
    ("--image missing.png", ["--image='missing.png'", "no such file"]),
    ("--image notes.png", ["--image='notes.png'", "not a readable image"]),
    ("--image first.png --trajectory missing.txt", ["--trajectory='missing.txt'", "no such file"]),
    ("--image first.png --trajectory garbage.txt", ["--trajectory='garbage.txt'", "3 fields"]),
    ("--image first.png --trajectory short.txt --frames 5", ["--trajectory='short.txt'", "2 cameras"]),
    ("--image first.png --trajectory cams.txt --preset yaw90", ["give one of them"]),
    ("--image first.png --trajectory cams.txt --scale_divisor 0", ["--scale_divisor=0.0"]),
    ("--scale_divisor 2", ["--scale_divisor=2.0", "--trajectory only"]),
]


def test_sample_refuses_bad_inputs(tiny_checkpoint, sample_inputs, capsys):
  import sample  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  before = snapshot(sample_inputs, workdir)
  for args, expected in SAMPLE_BAD:
    code = sample.main(["--workdir", str(workdir), *args.split()])
    err = refused(capsys, code, *expected)
    assert err.startswith("sample.py: "), err
    assert snapshot(sample_inputs, workdir) == before, args
  code = sample.main(["--workdir", str(sample_inputs / "nothing")])
  refused(capsys, code, "nothing")
  assert snapshot(sample_inputs, workdir) == before


def test_sample_outputs_are_never_replaced(tiny_checkpoint, sample_inputs, capsys):
  """Default names are new per run, defaults and cuts are said, the JSON is strict."""
  import sample  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  name = workdir.name
  for n in range(2):
    assert sample.main(["--workdir", str(workdir), "--frames", "3", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    path = sample_inputs / "samples" / f"{name}_step2_clip0_{n}.gif"
    assert f"defaults: --shift 3, --out samples/{name}_step2_clip0_{n}.gif (a new name)" in out
    assert path.exists() and path.with_suffix(".json").exists()
  report = json.loads(path.with_suffix(".json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
  assert report["psnr"][0] is None or math.isfinite(report["psnr"][0])
  assert report["frames"] == 3 and report["steps"] == 1
  first = (sample_inputs / "samples" / f"{name}_step2_clip0_0.gif").read_bytes()
  # A trajectory longer than --frames is cut, in one line; an explicit existing --out needs --overwrite.
  assert sample.main(["--workdir", str(workdir), "--image", "first.png", "--trajectory", "cams.txt", "--frames", "3",
                      "--steps", "1", "--out", "taken.gif", "--overwrite"]) == 0
  out = capsys.readouterr().out
  assert "cams.txt has 7 cameras; using the first 3 (--frames)" in out
  assert "--scale_divisor 1 (the checkpoint's data.scale_divisor)" in out
  assert (sample_inputs / "taken.gif").stat().st_size > 6 and (sample_inputs / "taken.json").exists()
  assert (sample_inputs / "samples" / f"{name}_step2_clip0_0.gif").read_bytes() == first


# ------------------------------------------------------------------------------------------------------------
# python -m jaxwm.evaluation.loop_closure

LOOP_BAD = [
    ("--clips 0", ["--clips=0"]),
    ("--steps 0", ["--steps=0"]),
    ("--frames 0", ["--frames=0"]),
    ("--frames 4", ["--frames=4", "1 + k * 2"]),
    ("--seed -3", ["--seed=-3"]),
    ("--shift 0", ["--shift=0.0", "> 0"]),
    ("--shift nan", ["--shift=nan", "finite"]),
    ("--noise-scale 0", ["--noise-scale=0.0", "> 0"]),
    ("--top-k a", ["--top-k='a'"]),
    ("--top-k 0", ["--top-k=0"]),
    ("--memory full,cache", ["--memory='cache'"]),
    ("--memory-kwargs [1]", ["--memory-kwargs='[1]'", "object"]),
    ("--memory-kwargs {", ["--memory-kwargs='{'", "not JSON"]),
    ('--memory-kwargs {"window":{"window":4}}', ["--memory-kwargs=", "'window' is not among --memory=full"]),
    ('--memory window --memory-kwargs {"window":{"size":4}}', ["--memory-kwargs=", "for 'window'", "size"]),
    ("--selection best", ["--selection='best'"]),
    ("--selection topk", ["frame-sparse model"]),
    ("--lpips missing.npz", ["--lpips='missing.npz'"]),
    ("--out lc", ["--out='lc'", "lc.json exists", "--overwrite"]),
    ("--family spiral", ["'spiral'"]),
]


def test_loop_closure_refuses_bad_inputs(tiny_checkpoint, scratch, capsys):
  from jaxwm.evaluation import loop_closure  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  (scratch / "lc.json").write_text("{}")
  before = snapshot(scratch, workdir)
  for args, expected in LOOP_BAD:
    code = loop_closure.main(["--checkpoint", str(workdir), *args.split()])
    err = refused(capsys, code, *expected)
    assert err.startswith("loop_closure: "), err
    assert snapshot(scratch, workdir) == before, args
  refused(capsys, loop_closure.main(["--checkpoint", str(scratch / "nothing")]), "nothing")
  assert snapshot(scratch, workdir) == before


def test_loop_closure_default_output_and_sampling_flags(tiny_checkpoint, tmp_path, capsys, monkeypatch):
  """Not into the repository's tracked results/: ``<workdir>/loop_closure/<family>_step<k>_<n>``, a new n per run.
  ``--steps`` / ``--shift`` / ``--noise-scale`` override the checkpoint's ``config.sample``: the sampler's time grid
  is the closed form ``s t / (1 + (s - 1) t)`` on ``t = 1, 1/2, 0``, and all three are recorded."""
  from jaxwm.evaluation import loop_closure  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling import clips as clips_lib  # pylint: disable=g-import-not-at-top
  src, _, _ = tiny_checkpoint
  workdir = tmp_path / "run"
  shutil.copytree(src / "checkpoints", workdir / "checkpoints")
  seen, make = [], clips_lib.make_sampler

  def spy(model, variables, config, num_frames, num_steps=None, shift=None, noise_scale=None):
    sampler = make(model, variables, config, num_frames, num_steps, shift, noise_scale)
    seen.append((np.asarray(sampler.schedule), config.sample.shift, sampler.noise_scale))
    return sampler

  monkeypatch.setattr(clips_lib, "make_sampler", spy)
  for n, flags in enumerate([["--shift", "6.5", "--noise-scale", "0.5"], []]):
    assert loop_closure.main(["--checkpoint", str(workdir / "checkpoints"), "--clips", "1", "--steps", "2",
                              "--frames", "3", *flags]) == 0
    out = workdir / "loop_closure" / f"loops_step2_{n}"
    assert f"writing to {out}.json/.md" in capsys.readouterr().out
    saved = json.loads(out.with_suffix(".json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    schedule, own, scale = seen[-1]
    s = 6.5 if flags else own
    np.testing.assert_allclose(schedule, [1.0, 0.5 * s / (1 + 0.5 * (s - 1)), 0.0], rtol=1e-6, atol=1e-7)
    assert scale == (0.5 if flags else 1.0)
    assert saved["sampling"] == {"num_steps": 2, "shift": s, "noise_scale": scale}
    said = f"2 Euler steps per chunk, schedule shift {s:g}" + (", noise scale 0.5." if flags else ".")
    assert said in out.with_suffix(".md").read_text()
  assert own != 6.5  # the checkpoint's own shift differs from the flag's


@pytest.mark.parametrize("args,expected", [
    ("--arms viewrope,spiral", ["--arms", "'spiral'", "rope3d"]),
    ("--seed-arms nope", ["--seed-arms", "'nope'"]),
    ("--scale w384 --arms gta", ["--scale w384", "--no-stages"]),
    ("--scale w999", ["--scale", "w999"]),
])
def test_reproduction_refuses_bad_inputs(args, expected, capsys, tmp_path):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("reproduction", ROOT / "benchmarks" / "reproduction.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  with pytest.raises(SystemExit) as e:
    mod.main([*args.split(), "--runs", str(tmp_path / "r"), "--results", str(tmp_path / "j")])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  for piece in expected:
    assert piece in err, (piece, err)
  assert not any(tmp_path.iterdir())


def _encodings_bench():
  """The module, ``sys.path`` restored after its import: it puts ``benchmarks/`` there for its sibling imports, and
  left there a benchmark named as a standard library module shadows it in this worker's subprocesses
  (``benchmarks/encodings.py``, now ``encoding_speed.py``, stopped ``tests/test_hugepages.py``'s probe from
  starting when it ran after this on one worker)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  saved = list(sys.path)
  try:
    spec = importlib.util.spec_from_file_location("encodings_covis", ROOT / "benchmarks" / "encodings_covis.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  finally:
    sys.path[:] = saved
  return mod


@pytest.mark.parametrize("args,expected", [("--arms viewrope,spiral", ["--arms", "'spiral'"]),
                                           ("--steps 0", ["--steps=0"]), ("--seeds a,b", ["--seeds", "'a,b'"])])
def test_encodings_benchmark_refuses_bad_inputs(args, expected, capsys, tmp_path):
  with pytest.raises(SystemExit) as e:
    _encodings_bench().main([*args.split(), "--runs", str(tmp_path / "r"), "--results", str(tmp_path / "j")])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  for piece in expected:
    assert piece in err, (piece, err)
  assert not any(tmp_path.iterdir())


def test_encodings_benchmark_report_pools_frames(tmp_path, capsys):
  """The report's co-visible cell is the mean over every scored frame (unscored frames left out), per arm."""
  mod = _encodings_bench()
  frames = lambda *v: [{"covis_psnr": x, "revealed_psnr": None} for x in v]  # noqa: E731
  row = lambda clip, *v: {"clip": clip, "return_psnr": 25.0, "covis_per_frame": frames(*v)}  # noqa: E731
  fams = {"loops": [row(0, 20.0, 22.0, None), row(1, 30.0)], "walks": [row(0, 24.0)]}
  (tmp_path / "gta_s0.json").write_text(json.dumps({"arm": "gta", "seed": 0, "step": 3, "families": fams}))
  mod.main(["--arms", "gta,prope", "--phase", "report", "--results", str(tmp_path)])
  summary = json.loads((tmp_path / "encodings_summary.json").read_text())
  assert summary == {"gta": {"loops": 24.0, "walks": 24.0}}  # (20 + 22 + 30) / 3; prope has no result: no row
  table = (tmp_path / "encodings.md").read_text()
  assert "| gta | 1 | 24.00 [" in table and "prope" not in table.split("| --- |")[-1]
  mean, lo, hi = mod.bootstrap([[21.0, 30.0]])
  assert mean == 25.5 and 21.0 <= lo <= mean <= hi <= 30.0
