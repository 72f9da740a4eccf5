"""Training: config checks, data pipeline, sharded steps, resharding checkpoints, exact resume,
non-finite stop, and train -> sample end to end."""

import json
import threading
import time

import jax
import numpy as np
import pytest
from conftest import tiny_config

from jaxwm.checkpoint import Checkpointer
from jaxwm.data.procedural import ProceduralClips
from jaxwm.data.window import ClipWindow
from jaxwm.training import data as data_lib
from jaxwm.training import sharding as sh
from jaxwm.training.config_utils import check_overrides
from jaxwm.training.loop import NonFiniteLossError, Trainer, run
from jaxwm.training.runner import Hook


def _one_device():
  return sh.make_mesh(1, 1, jax.devices()[:1])


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_unknown_config_key_names_closest():
  c = tiny_config()
  check_overrides(["--config.optim.lr=1e-3", "--workdir=x"], c)
  with pytest.raises(ValueError, match=r"unknown config key 'optim.lrr'.*did you mean optim\.lr"):
    check_overrides(["--config.optim.lrr=1e-3"], c)


def test_clip_window_reanchors_and_resizes():
  clip = ProceduralClips("train", 1, num_frames=9, image_hw=(32, 32), family="free")[0]
  out = ClipWindow(4, 2, 16).random_map(clip, np.random.default_rng(0))
  assert out["frames"].shape == (4, 16, 16, 3) and out["frames"].dtype == np.uint8
  np.testing.assert_allclose(out["c2w"][0], np.eye(4), atol=1e-6)
  start = [s for s in range(3) if np.allclose(
      np.linalg.inv(clip["c2w"][s]) @ clip["c2w"][s + 2], out["c2w"][1], atol=1e-5)]
  assert start, "window frames are not at stride 2"
  s = start[0]
  block = clip["frames"][s].astype(np.float32).reshape(16, 2, 16, 2, 3).mean((1, 3))
  np.testing.assert_array_equal(out["frames"][0], np.clip(np.rint(block), 0, 255).astype(np.uint8))
  np.testing.assert_allclose(out["intrinsics"][0, 0, 0], clip["intrinsics"][0, 0, 0] / 2)


def test_the_loader_reads_a_bounded_way_ahead_and_its_batches_do_not_depend_on_it(monkeypatch):
  """``data.read_ahead`` batches at most are read beyond those taken (grain's default reads 500 records ahead: a
  4-step test rendered hundreds of clips), and the batches equal those of a loader that reads nothing ahead (no
  reader threads: each record read in the main thread when its batch is taken)."""
  read, lock, real = [], threading.Lock(), ProceduralClips.__getitem__

  def counted(self, i):
    with lock:
      read.append(int(i))
    return real(self, i)

  monkeypatch.setattr(ProceduralClips, "__getitem__", counted)
  got = {}
  for ahead in (1, 3):
    read.clear()
    c = tiny_config(**{"data.read_ahead": ahead, "data.num_clips": 64})
    it = iter(data_lib.make_loader(c.data, c.seed, 4))
    got[ahead] = [next(it) for _ in range(3)]
    time.sleep(1.0)  # the readers run ahead as far as they may
    assert 12 < len(read) <= 12 + 4 * ahead, (ahead, len(read))
  real_options = data_lib.grain.ReadOptions
  monkeypatch.setattr(data_lib.grain, "ReadOptions", lambda **_: real_options(num_threads=0, prefetch_buffer_size=0))
  read.clear()
  it = iter(data_lib.make_loader(c.data, c.seed, 4))
  want = [next(it) for _ in range(3)]
  time.sleep(0.2)
  assert len(read) == 12  # read as taken, nothing ahead
  for ahead in (1, 3):
    for a, b in zip(got[ahead], want):
      for key in a:
        np.testing.assert_array_equal(a[key], b[key])


@pytest.fixture(scope="module")
def batch():
  c = tiny_config()
  loader = Trainer(c, "/tmp/unused", mesh=_one_device()).make_loader()
  return next(iter(loader))


def test_sharded_step_equals_single_device(batch, tmp_path):
  c = tiny_config()
  results = []
  for mesh in (_one_device(), sh.make_mesh(4, 2), sh.make_mesh(2, 4)):
    tr = Trainer(c, tmp_path, mesh=mesh)
    state = tr.init_state()
    with jax.set_mesh(mesh):
      state, metrics = tr.train_step(state, tr.put_batch(batch), jax.random.key(0))
    results.append((float(metrics["loss"]), _leaves(state.params)))
    if mesh.devices.size == 8:
      kernel = state.params["blocks"]["attn1"]["to_q"]["kernel"]  # [layers, embed, heads]: embed over fsdp
      assert kernel.sharding.spec[1] == "fsdp"
  for loss, params in results[1:]:
    assert abs(loss - results[0][0]) <= 1e-5 * abs(results[0][0])
    for a, b in zip(params, results[0][1]):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_checkpoint_restores_on_other_meshes(tmp_path):
  c = tiny_config()
  tr = Trainer(c, tmp_path, mesh=sh.make_mesh(2, 4))
  state = tr.init_state()
  ck = Checkpointer(tmp_path / "ck", async_save=True)
  ck.save(7, state, config=c)
  ck.wait()
  for mesh in (sh.make_mesh(4, 2), _one_device()):
    other = Trainer(c, tmp_path, mesh=mesh)
    restored, step = Checkpointer(tmp_path / "ck").restore(other.restore_target())
    assert step == 7
    for a, b in zip(_leaves(restored), _leaves(state)):
      np.testing.assert_array_equal(a, b)
    leaf = restored.params["blocks"]["ffn_in"]["kernel"]
    assert leaf.sharding.mesh.devices.size == mesh.devices.size
  ck.close()


class _Crash(Exception):
  pass


class _CrashAfterSave(Hook):
  """Ends the run after step ``at`` and its checkpoint (a lost host: nothing after it is written)."""

  def __init__(self, at):
    self.at = at

  def after_save(self, task, state, done):
    if done == self.at:
      raise _Crash(done)


def test_exact_resume(tmp_path):
  """A run that dies after its step-2 checkpoint, restarted with the same config, ends bitwise equal to one that
  never stopped (state, EMA, optimiser, data order); the restart runs only the missing steps."""
  c = tiny_config(**{"train.num_steps": 4, "train.ckpt_every": 2, "optim.ema_decay": 0.9})
  straight, hist_a = run(c, tmp_path / "a", mesh=_one_device(), progress=False)
  with pytest.raises(_Crash):
    run(c, tmp_path / "b", mesh=_one_device(), progress=False, hooks=[_CrashAfterSave(2)])
  resumed, hist_b = run(c, tmp_path / "b", mesh=_one_device(), progress=False)  # restarts from step 2
  assert len(hist_b) == 2 and hist_b == hist_a[2:]
  assert straight.ema and int(straight.step) == 4
  for a, b in zip(_leaves(resumed), _leaves(straight)):
    np.testing.assert_array_equal(a, b)


def test_non_finite_stops_before_checkpoint(tmp_path):
  c = tiny_config(**{"optim.lr": float("nan"), "train.ckpt_every": 1})
  with pytest.raises(NonFiniteLossError, match="non-finite training state at step 1"):
    run(c, tmp_path, mesh=_one_device(), progress=False)
  assert Checkpointer(tmp_path / "checkpoints").latest_step() is None


def test_train_then_sample(tiny_checkpoint, tmp_path):
  import sample  # pylint: disable=g-import-not-at-top
  workdir, c, hist = tiny_checkpoint
  assert len(hist) == 2 and all(np.isfinite(hist))
  assert (workdir / "samples" / "step_000002.gif").exists()
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(x)["step"] for x in lines] == [1, 2]
  assert list((workdir / "tb").glob("events.out.tfevents.*"))
  out = tmp_path / "s.gif"
  assert sample.main(["--workdir", str(workdir), "--clip", "3", "--out", str(out)]) == 0
  report = json.loads(out.with_suffix(".json").read_text())
  assert report["checkpoint_step"] == 2 and len(report["psnr"]) == c.data.num_frames
  assert report["return_frame"] == 4 and np.isfinite(report["loop_closure_psnr"])
  cov = report["covisible"]  # eval clip 3: yaw 180 degrees; frames 1-3 of the window are scored
  assert [f["frame"] for f in cov["per_frame"]] == [1, 2, 3]
  assert cov["covis_frames"] == sum(f["covis_psnr"] is not None for f in cov["per_frame"])
  walk = tmp_path / "w.gif"
  assert sample.main(["--workdir", str(workdir), "--family", "walks", "--clip", "2", "--steps", "1",
                      "--out", str(walk)]) == 0
  cov = json.loads(walk.with_suffix(".json").read_text())["covisible"]
  assert len(cov["per_frame"]) == c.data.num_frames - 1 and cov["covis_frames"] >= 1 and cov["warp_covis_psnr"] > 30
  assert sample.main(["--workdir", str(tmp_path / "nothing")]) == 2


def test_init_from_an_earlier_stage(tiny_checkpoint, tmp_path):
  """``train.init_from`` (progressive stages): the next stage starts from the earlier run's parameters with a
  fresh optimizer, may change the encoding, and names the parameter that does not fit."""
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import _init_from  # pylint: disable=g-import-not-at-top
  workdir, _, _ = tiny_checkpoint
  _, _, variables, _ = load_model(workdir)
  c = tiny_config(**{"model.camera.encoding": "rope3d"})
  tr = Trainer(c, tmp_path / "next", mesh=_one_device())
  state = _init_from(tr, tr.init_state(), str(workdir))
  assert int(state.step) == 0
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(state.params),
                         jax.device_get(variables["params"]))
  wide = tiny_config(**{"model.ffn_dim": 2 * c.model.ffn_dim})
  tr = Trainer(wide, tmp_path / "wide", mesh=_one_device())
  from jaxwm.training.loop import RunRefusedError  # pylint: disable=g-import-not-at-top
  with pytest.raises(RunRefusedError, match=r"train.init_from=.*ffn_in.*has shape"):
    _init_from(tr, tr.init_state(), str(workdir))
