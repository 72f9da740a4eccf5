"""Test setup: CPU only, 8 fake devices, absl flags marked parsed, shared fixtures."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  _flags += " --xla_force_host_platform_device_count=8"
# Tiny programs: compile fast, run a bit slower. The backend at O0 saves ~30% of compile time; XLA:CPU's
# legacy emitters instead of its fusion emitters halve what is left (the suite: 11:52 -> about 9 min cold).
# Both change code generation only; a program is still deterministic, but two different programs that compute the
# same values may differ in the last bit, so bitwise tests compare runs of one program.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false")
if "xla_backend_optimization_level" not in _flags:
  _flags += " " + TEST_XLA_FLAGS
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import sys  # noqa: E402
import tempfile  # noqa: E402

# The repository root (configs/, train.py, sample.py) is importable from the tests.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

# Identical programs (one train step per Trainer, sampler steps) compile once per test run.
jax.config.update("jax_compilation_cache_dir", os.environ.get("JAXWM_TEST_JAX_CACHE",
                                                              os.path.join(tempfile.gettempdir(), "jaxwm_test_jax_cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# grain's multiprocess loader and other absl users read flags; pytest never parses them.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()


@pytest.fixture(scope="session")
def rng():
  return np.random.default_rng(0)


def random_rotations(rng, n):
  """``[n, 3, 3]`` float64 uniformly random rotations (QR of Gaussians, det fixed to +1)."""
  q, r = np.linalg.qr(rng.normal(size=(n, 3, 3)))
  q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
  q[np.linalg.det(q) < 0, :, 0] *= -1
  return q


def random_poses(rng, n, scale=2.0):
  """``[n, 4, 4]`` float64 random rigid camera-to-world transforms."""
  t = np.tile(np.eye(4), (n, 1, 1))
  t[:, :3, :3] = random_rotations(rng, n)
  t[:, :3, 3] = rng.normal(scale=scale, size=(n, 3))
  return t


def random_intrinsics(rng, n, hw=(48, 64)):
  """``[n, 3, 3]`` float64 pinhole intrinsics with some skew-free variety."""
  h, w = hw
  k = np.zeros((n, 3, 3))
  k[:, 0, 0] = rng.uniform(0.6, 1.4, n) * w
  k[:, 1, 1] = rng.uniform(0.6, 1.4, n) * w
  k[:, 0, 2] = w / 2 + rng.uniform(-3, 3, n)
  k[:, 1, 2] = h / 2 + rng.uniform(-3, 3, n)
  k[:, 2, 2] = 1
  return k


def tiny_config(**overrides):
  """A very small training config: 16x16 frames rendered on the fly, 5 frames, 2-layer model."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  c.model.update(dim=64, num_heads=2, num_layers=2, ffn_dim=64, freq_dim=32, text_dim=16, patch_size=(1, 2, 2))
  c.model.camera.update(encoding="viewrope", channels="t_low")  # the tests' model (tiny's until 2026-12-02)
  c.recipe.layout = "teacher_forcing"  # tiny's until 2026-12-02
  c.optim.ema_decay = 0.999
  c.recipe.timestep_distribution = "uniform"
  c.data.update(source="procedural", num_clips=16, clips_per_scene=8, clip_frames=9, render_size=16, image_size=16,
                num_frames=5, frame_stride=2, batch_size=8)
  c.optim.update(warmup_steps=2)
  c.train.update(num_steps=4, log_every=1, ckpt_every=2, sample_every=0, gain_every=0, async_checkpoint=False)
  c.sample.update(num_steps=3)
  return apply_overrides(c, overrides)


def apply_overrides(c, overrides):
  """``c`` with ``{"a.b.c": value}`` overrides set in place (returned)."""
  for k, v in overrides.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


def train_steps(config, workdir, steps=3):
  """``steps`` train steps of ``config`` on one fixed batch (1-device mesh): ``(trainer, state, losses)``."""
  from jaxwm.training import sharding  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top
  tr = Trainer(config, workdir, mesh=sharding.make_mesh(1, 1, jax.devices()[:1]))
  state = tr.init_state()
  batch = tr.put_batch(next(iter(tr.make_loader())))
  losses = []
  with jax.set_mesh(tr.mesh):
    for _ in range(steps):
      state, m = tr.train_step(state, batch, jax.random.key(0))
      losses.append(float(m["loss"]))
  return tr, state, losses


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
  """A workdir with a 2-step checkpoint of :func:`tiny_config` (one per test worker)."""
  from jaxwm.training import sharding  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import run  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp("tiny_run")
  config = tiny_config(**{"train.num_steps": 2, "train.sample_every": 2})
  from jaxwm.evaluation.hooks import training_hooks  # pylint: disable=g-import-not-at-top
  _, history = run(config, workdir, mesh=sharding.make_mesh(1, 1, jax.devices()[:1]), progress=False,
                   hooks=training_hooks(config))
  return workdir, config, history


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Slow-marked tests first (a stable sort, the same on every xdist worker): the longest start while the
  rest fill the other workers, instead of running alone at the end."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)
