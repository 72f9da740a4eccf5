"""Fault injection on real `train.py` runs: each fault, what happened, the steps lost, and whether the resumed run
ends bitwise equal to an uninterrupted one (issue: survive the pod).

  python benchmarks/faults.py                 # about 10 train.py runs of a tiny model, a few minutes on 2 cores

Every run is `python train.py` in a subprocess with a tiny model on procedural frames (12 steps, a checkpoint
every 4, synchronous saves). The reference runs uninterrupted; each fault then runs, is resumed with the same
command, and the final parameters are compared with the reference's, bit for bit. The lost-process fault of a
two-process run is `tests/test_distributed.py` (it needs two process groups; not repeated here).
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS, EVERY = 12, 4
OVERRIDES = [
    "--config.model.dim=64", "--config.model.num_heads=2", "--config.model.num_layers=2", "--config.model.ffn_dim=64",
    "--config.model.freq_dim=32", "--config.model.camera.encoding=viewrope", "--config.model.camera.channels=t_low",
    "--config.recipe.layout=teacher_forcing", "--config.data.source=procedural", "--config.data.num_clips=16",
    "--config.data.clips_per_scene=8", "--config.data.clip_frames=9", "--config.data.render_size=16",
    "--config.data.image_size=16", "--config.data.num_frames=5", "--config.data.frame_stride=2",
    "--config.data.batch_size=8", f"--config.train.num_steps={STEPS}", f"--config.train.ckpt_every={EVERY}",
    "--config.train.sample_every=0", "--config.train.gain_every=0", "--config.train.async_checkpoint=False",
    "--config.train.log_every=1", "--config.train.keep=4"]


def _cmd(workdir):
  return [sys.executable, "train.py", "--config=configs/tiny.py", *OVERRIDES, f"--workdir={workdir}"]


def _env():
  return {**os.environ, "JAX_PLATFORMS": "cpu"}


def train(workdir):
  r = subprocess.run(_cmd(workdir), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
  return r.returncode, r.stdout + r.stderr


def _logged(workdir):
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return 0
  steps = [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]
  return max(steps, default=0)


def _steps(workdir):
  ck = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) if ck.exists() else []


def interrupt(workdir, sig, at_step):
  """Starts a run, sends ``sig`` once ``at_step`` is logged; returns (exit code, steps logged, last checkpoint)."""
  p = subprocess.Popen(_cmd(workdir), cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.monotonic() + 600
  while _logged(workdir) < at_step and p.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  p.send_signal(sig)
  p.communicate(timeout=300)
  return p.returncode, _logged(workdir), max(_steps(workdir), default=0)


def params(workdir):
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  _, _, variables, step = load_model(workdir, use_ema=False)
  return step, [np.asarray(x) for x in jax.tree_util.tree_leaves(variables)]


def same(a, b):
  return a[0] == b[0] and len(a[1]) == len(b[1]) and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))


def _largest(step_dir):
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in p.as_posix()]
  return max(files, key=lambda p: p.stat().st_size)


def _flip(path):
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x10
  path.write_bytes(bytes(data))


DAMAGE = {  # name: what is done to the newest step of a finished run
    "a bit flipped in the newest step": lambda ck: _flip(_largest(ck / str(STEPS))),
    "the newest step truncated": lambda ck: os.truncate(_largest(ck / str(STEPS)),
                                                        _largest(ck / str(STEPS)).stat().st_size // 2),
    "a file of the newest step deleted": lambda ck: _largest(ck / str(STEPS)).unlink(),
}


def main():
  from jaxwm import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  scratch = pathlib.Path(tempfile.mkdtemp(prefix="jaxwm_faults_"))
  rows = []
  t0 = time.time()
  ref = scratch / "reference"
  code, out = train(ref)
  assert code == 0, out[-2000:]
  want = params(ref)
  print(f"reference: {STEPS} steps, {time.time() - t0:.0f} s", flush=True)

  for name, sig, at in (("SIGTERM (a preemption) once step 6 is logged", signal.SIGTERM, 6),
                        ("SIGINT (Ctrl-C) once step 6 is logged", signal.SIGINT, 6),
                        ("kill -9 once step 6 is logged", signal.SIGKILL, 6)):
    wd = scratch / name.split()[0].lower().replace("-", "")
    code, logged, last = interrupt(wd, sig, at)
    rcode, out = train(wd)
    what = f"exit {code}; step {last} committed" + ("" if rcode == 0 else f"; resume failed: {out[-300:]}")
    rows.append((name, what, logged - last, "yes" if rcode == 0 and same(params(wd), want) else "no"))
    print(rows[-1], flush=True)

  wd = scratch / "unfinished"
  shutil.copytree(ref, wd)
  ck = wd / "checkpoints"
  tmp = ck / f"{STEPS}{ckpt_lib.TMP_SUFFIX}"
  os.rename(ck / str(STEPS), tmp)
  _largest(tmp).unlink()
  code, out = train(wd)
  rows.append(("a save cut short (the newest step left in Orbax's temporary directory)",
               f"resumed from step {STEPS - EVERY}" if code == 0 else f"failed: {out[-300:]}", EVERY,
               "yes" if code == 0 and same(params(wd), want) else "no"))
  print(rows[-1], flush=True)
  for name, damage in DAMAGE.items():
    wd = scratch / name.split()[1]
    shutil.copytree(ref, wd)
    damage(wd / "checkpoints")
    code, out = train(wd)
    named = "named and set aside" if "is damaged" in out else "not named"
    rows.append((name, f"{named}; resumed from step {STEPS - EVERY}" if code == 0 else f"failed: {out[-300:]}",
                 EVERY, "yes" if code == 0 and same(params(wd), want) else "no"))
    print(rows[-1], flush=True)

  print(f"\n{time.time() - t0:.0f} s in all\n")
  print("| fault | what happened | steps lost | resumed bitwise |")
  print("| --- | --- | --- | --- |")
  for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
  shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
  main()
