"""Faults (issue 16): damaged or incomplete checkpoints are named and skipped (training resumes from
the newest intact step and ends bitwise equal to an uninterrupted run; ``load_model`` loads it), a
workdir is locked by one run, resumes rewind metrics, re-apply ``keep``, redo a missed sample, and
refuse another model in one line."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import tiny_config

from jaxwm import checkpoint as ckpt_lib
from jaxwm.sampling.load import load_model
from jaxwm.evaluation import hooks as hooks_lib
from jaxwm.evaluation.hooks import training_hooks
from jaxwm.training import loop
from jaxwm.training import workdir as workdir_lib
from jaxwm.training.runner import Hook, StopRequested
from jaxwm.training import sharding as sh

_ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # most tests resume, damage or interrupt a shared training run


def _config(**kw):
  return tiny_config(**{"train.num_steps": 6, "train.ckpt_every": 2, "train.keep": 3, **kw})


def _run(config, workdir):
  return loop.run(config, workdir, mesh=sh.make_mesh(1, 1, jax.devices()[:1]), progress=False,
                  hooks=training_hooks(config))


def _host(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(tree))]


def _assert_same(a, b):
  a, b = _host(a), _host(b)
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


def _snapshot(root):
  """``{relpath: (is_dir, size, mtime_ns)}`` of everything under ``root``."""
  out = {}
  for p in sorted(pathlib.Path(root).rglob("*")):
    st = p.stat()
    out[str(p.relative_to(root))] = (p.is_dir(), st.st_size, st.st_mtime_ns)
  return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted 6-step run (checkpoints 2, 4, 6): ``(workdir, final state)``."""
  workdir = tmp_path_factory.mktemp("faults") / "reference"
  state, _ = _run(_config(), workdir)
  return workdir, jax.device_get(state)


def _largest(step_dir):
  """The largest array data file of a step (OCDBT data of the train state)."""
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in p.as_posix()]
  return max(files, key=lambda p: p.stat().st_size)


def _flip_bit(path):
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x10
  path.write_bytes(bytes(data))


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(path.stat().st_size // 2)


def _kill_during_save(ck):
  """Step 6 never committed: its files are in Orbax's temporary directory, some missing."""
  tmp = ck / f"6{ckpt_lib.TMP_SUFFIX}"
  os.rename(ck / "6", tmp)
  (tmp / ckpt_lib.CHECKSUMS).unlink()
  _largest(tmp).unlink()


# name: (damage(checkpoints dir), text expected in the report of step 6, or None when 6 is no step)
FAULTS = {
    "kill_during_save": (_kill_during_save, None),
    "bit_flip": (lambda ck: _flip_bit(_largest(ck / "6")), "does not match its checksum"),
    "truncated_file": (lambda ck: _truncate(_largest(ck / "6")), "truncated"),
    "deleted_file": (lambda ck: _largest(ck / "6").unlink(), "missing"),
    "missing_metadata": (lambda ck: (ck / "6" / "state" / "_METADATA").unlink(), "state/_METADATA missing"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_damaged_newest_step_falls_back(fault, reference, tmp_path, capsys):
  ref_dir, ref_state = reference
  workdir = tmp_path / "w"
  shutil.copytree(ref_dir, workdir)
  ck = workdir / "checkpoints"
  damage, reason = FAULTS[fault]
  damage(ck)

  # Sampling / load_model: the newest intact step, the damaged one named (and left in place).
  _, _, variables, step = load_model(workdir, use_ema=False)
  assert step == 4
  _, _, want, _ = load_model(ref_dir, step=4, use_ema=False)
  _assert_same(variables, want)
  err = capsys.readouterr().err
  if reason is None:
    assert "unfinished save" in err and f"6{ckpt_lib.TMP_SUFFIX}" in err
  else:
    assert f"checkpoint step 6 in {ck} is damaged: " in err and reason in err, err
    assert (ck / "6").is_dir() and not (ck / "damaged").exists()
    with pytest.raises(ckpt_lib.DamagedCheckpointError, match=f"step 6 .* damaged: .*{reason}"):
      load_model(workdir, step=6)

  if fault == "bit_flip":  # sample.py: the same, on the command line
    import sample  # pylint: disable=g-import-not-at-top
    out = tmp_path / "s.gif"
    assert sample.main(["--workdir", str(workdir), "--frames", "3", "--steps", "1", "--out", str(out)]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["checkpoint_step"] == 4
    assert f"checkpoint step 6 in {ck} is damaged: " in capsys.readouterr().err
  if fault in ("deleted_file", "truncated_file", "missing_metadata"):  # training: the same path as bit_flip
    return
  # Training: resumes from step 4, sets step 6 aside, ends equal to the uninterrupted run.
  state, history = _run(_config(), workdir)
  out = capsys.readouterr()
  assert len(history) == 2 and "resumed from step 4" in out.out
  _assert_same(state, ref_state)
  if reason is not None:
    assert reason in out.err and (ck / "damaged" / "6").is_dir()
  assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["2", "4", "6"]
  assert not (ck / f"6{ckpt_lib.TMP_SUFFIX}").exists()  # Orbax replaced the unfinished save
  assert ckpt_lib.verify_step(ck / "6") == ("ok", None)
  steps = [json.loads(x)["step"] for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2, 3, 4, 5, 6], steps  # rewound to 4, then 5 and 6 once
  assert len(list((workdir / "tb").glob("events.out.tfevents.*"))) == 2


def test_garbage_steps_stale_lock_retention_and_missed_sample(reference, tmp_path, capsys, monkeypatch):
  """Garbage newer "steps" (an empty directory, empty files) are set aside; a stale lock is taken over;
  ``keep`` is re-applied; the missed sample of the restored step is redone; a changed lr is logged."""
  ref_dir, ref_state = reference
  workdir = tmp_path / "w"
  shutil.copytree(ref_dir, workdir)
  ck = workdir / "checkpoints"
  (ck / "70").mkdir()
  (ck / "80" / "state").mkdir(parents=True)
  for name in ("_CHECKPOINT_METADATA", "state/_METADATA", "state/manifest.ocdbt"):
    (ck / "80" / name).touch()
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                        check=True).stdout.strip()
  (workdir / ".lock").write_text(json.dumps({"pid": int(dead), "host": socket.gethostname(), "started": "then"}))

  _, _, _, step = load_model(workdir)
  err = capsys.readouterr().err
  assert step == 6 and "step 80 in" in err and "step 70 in" in err and "empty directory" in err

  samples = []
  monkeypatch.setattr(hooks_lib, "write_sample", lambda tr, params, s, path: samples.append((s, path)))
  c = _config(**{"train.keep": 2, "train.sample_every": 3, "optim.lr": 3e-3})
  state, history = _run(c, workdir)
  out = capsys.readouterr()
  assert history == []
  _assert_same(state, ref_state)
  assert f"taking over the stale lock of pid {dead}" in out.out
  assert "checkpoint step 80 in" in out.err and "_CHECKPOINT_METADATA is empty" in out.err
  assert "optim.lr: 0.002 -> 0.003" in out.out
  assert sorted(p.name for p in (ck / "damaged").iterdir()) == ["70", "80"]
  assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["4", "6"]  # keep=2
  assert samples == [(6, workdir / "samples" / "step_000006.gif")]
  assert json.loads((workdir / ".lock").read_text() or "null") is None  # released


def test_unverified_legacy_step(reference, tmp_path, capsys):
  """A step without checksums (written before them) loads with a note; if Orbax cannot read it, the
  next older step loads."""
  ref_dir, _ = reference
  workdir = tmp_path / "w"
  shutil.copytree(ref_dir, workdir)
  ck = workdir / "checkpoints"
  (ck / "6" / ckpt_lib.CHECKSUMS).unlink()
  assert load_model(workdir)[3] == 6
  assert "checkpoint step 6: no checksums.json" in capsys.readouterr().err
  for f in (ck / "6" / "state").rglob("*"):
    if f.is_file() and "/d/" in f.as_posix():  # every array file: the parameters' bytes too
      _truncate(f)
  assert load_model(workdir)[3] == 4
  assert "checkpoint step 6 in" in capsys.readouterr().err


def test_locked_workdir_is_refused_untouched(reference, tmp_path):
  ref_dir, _ = reference
  workdir = tmp_path / "w"
  shutil.copytree(ref_dir, workdir)
  lock = workdir_lib.WorkdirLock(workdir).acquire()
  try:
    before = _snapshot(workdir)
    with pytest.raises(loop.WorkdirLockedError, match=rf"in use by pid {os.getpid()} on host {socket.gethostname()}"):
      _run(_config(), workdir)
    # The command line: exit code 2, one line naming the holder, nothing changed.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "train.py", f"--workdir={workdir}", "--config.train.num_steps=6"],
                       cwd=_ROOT, capture_output=True, text=True, env=env, timeout=120, check=False)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert last.startswith(f"train.py: workdir {workdir} is in use by pid {os.getpid()}"), last
    assert _snapshot(workdir) == before
  finally:
    lock.release()


def test_resume_with_another_model_is_refused(reference, tmp_path):
  ref_dir, _ = reference
  workdir = tmp_path / "w"
  shutil.copytree(ref_dir, workdir)
  before = _snapshot(workdir / "checkpoints")
  c = _config(**{"model.camera.encoding": "rope3d", "model.num_layers": 3})
  with pytest.raises(loop.ResumeConfigError) as e:
    _run(c, workdir)
  msg = str(e.value)
  assert "\n" not in msg and "step 6" in msg
  assert "model.camera.encoding: 'viewrope' (checkpoint) != 'rope3d'" in msg
  assert "model.num_layers: 2 (checkpoint) != 3" in msg
  assert _snapshot(workdir / "checkpoints") == before


def test_config_differences():
  saved = json.loads(_config().to_json())
  c = _config(**{"model.camera.plucker": True, "model.remat": "full", "optim.lr": 3e-4, "train.num_steps": 9,
                 "data.image_size": 32, "train.log_every": 5})
  refused, logged = loop.resume_config_differences(saved, c)
  assert [k for k, _, _ in refused] == ["data.image_size", "model.camera.plucker"]
  assert [k for k, _, _ in logged] == ["model.remat", "optim.lr", "train.num_steps"]


def test_keep_below_one_is_refused(tmp_path):
  for keep in (0, -1):
    with pytest.raises(ValueError, match=rf"keep={keep}: must be an int >= 1"):
      ckpt_lib.Checkpointer(tmp_path / "ck", keep=keep)


def test_a_refused_run_leaves_no_workdir_behind(tmp_path):
  from jaxwm.training.loop import RunRefusedError, run  # pylint: disable=g-import-not-at-top
  (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
  c = tiny_config(**{"train.init_from": str(tmp_path / "empty")})
  with pytest.raises(RunRefusedError, match="train.init_from"):
    run(c, tmp_path / "new", mesh=sh.make_mesh(1, 1, jax.devices()[:1]), progress=False)
  assert not (tmp_path / "new").exists()


class _SignalAt(Hook):
  """Sends this process ``signame`` after step ``at`` (as a scheduler's preemption would), ``times`` times."""

  def __init__(self, at, signame="SIGTERM", times=1):
    self.at, self.signame, self.times = at, signame, times

  def after_save(self, task, state, done):
    if done == self.at:
      for _ in range(self.times):
        os.kill(os.getpid(), getattr(signal, self.signame))


def test_a_signal_stops_at_the_next_step_with_it_checkpointed_and_resumes_bitwise(reference, tmp_path):
  """SIGTERM (a preemption) during step 3: the run stops after step 3, off the ``ckpt_every=2`` cadence, with
  step 3 checkpointed; the same command resumes it, and the run ends bitwise equal to the uninterrupted reference
  with the same losses logged."""
  signame, times = "SIGTERM", 1
  ref_dir, ref_state = reference
  workdir = tmp_path / "w"
  c = _config()
  with pytest.raises(StopRequested, match=rf"stopped by {signame} at step 3: its checkpoint is committed"):
    loop.run(c, workdir, mesh=sh.make_mesh(1, 1, jax.devices()[:1]), progress=False, hooks=[_SignalAt(2, signame,
                                                                                                        times)])
  assert ckpt_lib.Checkpointer(workdir / "checkpoints").all_steps() == [2, 3]
  state, history = _run(c, workdir)
  assert len(history) == 3  # steps 4-6
  _assert_same(state, ref_state)
  rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  ref_rows = [json.loads(x) for x in (ref_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["loss"] for r in rows] == [r["loss"] for r in ref_rows]


def test_stop_signals_are_recorded_once_and_the_handlers_restored():
  """SIGINT twice (an impatient Ctrl-C) records the first and kills nothing while the loop runs; afterwards the
  previous handlers are back (Ctrl-C raises KeyboardInterrupt again)."""
  from jaxwm.training.runner import _StopSignals  # pylint: disable=g-import-not-at-top
  before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  with _StopSignals() as stops:
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    assert stops.requested == "SIGINT"
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_distributed_start_takes_the_configured_timeouts(monkeypatch):
  """``train.init_timeout_s`` / ``train.heartbeat_timeout_s`` reach ``jax.distributed.initialize``; a half-set
  environment is refused before anything starts."""
  import jax  # pylint: disable=g-import-not-at-top
  from conftest import tiny_config  # pylint: disable=g-import-not-at-top
  from jaxwm.training import workdir as wd  # pylint: disable=g-import-not-at-top
  seen = {}
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.update(kw))
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  wd.maybe_initialize_distributed(tiny_config(**{"train.distributed": True, "train.init_timeout_s": 7,
                                                  "train.heartbeat_timeout_s": 11}))
  assert seen == {"num_processes": 2, "process_id": 1, "initialization_timeout": 7, "heartbeat_timeout_seconds": 11}
  monkeypatch.delenv("JAX_PROCESS_ID")
  with pytest.raises(wd.RunRefusedError, match="JAX_PROCESS_ID"):
    wd.maybe_initialize_distributed(tiny_config(**{"train.distributed": True}))
