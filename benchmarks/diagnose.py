"""Where a checkpoint's loop-closure error comes from, measured (RESULTS.md "Diagnosis").

  python benchmarks/diagnose.py --checkpoint runs/tiny [--clips 16] [--steps 1,2,4,10,20] [--shifts 1,3]

1. Teacher-forced velocity error ``E(t) = mean (v_theta(x_t, t) - (eps - x0))^2`` of the noisy half of
   the training layout, by noise level ``t``, on training clips against eval loops (a gap is
   overfitting), with the full clean history against the first frame alone as history (what the
   rest of the history buys).
2. The memory gain of the return frame (:mod:`jaxwm.evaluation.memory_gain`).
3. Sampling: return-frame and all-frame PSNR of streamed eval loops by Euler steps and shift,
   with the mean-colour and copy-first baselines (:mod:`jaxwm.evaluation.baselines`).

Prints markdown tables; ``--out x.json`` keeps the numbers.
"""

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from jaxwm.data.window import ClipWindow  # pylint: disable=wrong-import-position
from jaxwm.diffusion import flow  # pylint: disable=wrong-import-position
from jaxwm.evaluation import baselines, memory_gain  # pylint: disable=wrong-import-position
from jaxwm.models import vae  # pylint: disable=wrong-import-position
from jaxwm.models.conditioning import Cameras, Frames  # pylint: disable=wrong-import-position
from jaxwm.models.loci import MemoryPlan  # pylint: disable=wrong-import-position
from jaxwm.sampling import clips as clips_lib  # pylint: disable=wrong-import-position
from jaxwm.sampling.load import load_model  # pylint: disable=wrong-import-position
from jaxwm.data.sources import data_of, make_source  # pylint: disable=wrong-import-position
from jaxwm.training.layout import make_layout  # pylint: disable=wrong-import-position

LEVELS = (0.1, 0.3, 0.5, 0.8, 1.0)


def _batch(config, split, n):
  """``n`` windows of the training source (``train``) or the eval loops (``eval``) as stacked arrays."""
  d = config.data
  if split == "eval":
    ws = [clips_lib.eval_clip(config, i) for i in np.linspace(0, 34, n).round().astype(int)]
  else:
    src = make_source(d, "train")
    win = ClipWindow(d.num_frames, d.frame_stride, d.image_size, scale_divisor=data_of(d).scale_divisor)
    ws = [win.random_map(src[int(i)], np.random.default_rng(int(i))) for i in np.linspace(0, len(src) - 1, n)]
  return {k: np.stack([w[k] for w in ws]) for k in ("frames", "c2w", "intrinsics")}


def velocity_errors(config, apply_fn, batch, history):
  """``t -> E(t)`` over the noisy half; ``history``: ``full`` or ``first`` (clean frame 0 only)."""
  layout = make_layout("teacher_forcing", config.data.num_frames, config.recipe.chunk_size)
  lat = vae.encode(jnp.asarray(batch["frames"]), config.data.latent_stride)
  b, n_clean = lat.shape[0], layout.num_clean
  clean, x0 = lat[:, layout.clean_frames], lat[:, layout.noisy_frames]
  eps = jax.random.normal(jax.random.key(0), x0.shape)
  mask = np.array(layout.mask)
  if history == "first":
    noisy = layout.noisy
    mask[np.ix_(noisy, np.arange(1, n_clean))] = False  # noisy frames see frame 0 and their own chunk
  cams = Cameras(jnp.asarray(batch["c2w"]), jnp.asarray(batch["intrinsics"])).frames(
      jnp.asarray(layout.frame_pos.astype(np.int32)))
  frames = Frames(pos=jnp.broadcast_to(jnp.asarray(layout.frame_pos, jnp.float32), (b, len(layout.frame_pos))),
                  cameras=cams, mask=jnp.asarray(mask)[None], local=jnp.asarray(layout.local)[None],
                  plan=MemoryPlan.make(layout.chunk, layout.writer))
  out = {}
  for t in LEVELS:
    tt = jnp.full((b, x0.shape[1]), t)
    seq = jnp.concatenate([clean, flow.noise(x0, eps, tt)], axis=1)
    ts = jnp.concatenate([jnp.zeros((b, n_clean)), tt * flow.TIMESTEP_SCALE], axis=1)
    v = apply_fn(seq, ts, frames)
    out[t] = float(jnp.mean(jnp.square(v[:, n_clean:] - flow.velocity_target(x0, eps))))
  return out


def sampling_scores(config, model, variables, clips, steps, shift):
  rows = []
  sampler = clips_lib.make_sampler(model, variables, config, config.data.num_frames, steps, shift)
  for i in np.linspace(0, 34, clips).round().astype(int):
    w = clips_lib.eval_clip(config, int(i))
    video = clips_lib.stream_clip(model, variables, config, w, key=jax.random.key(int(i)), sampler=sampler)
    rows.append({**baselines.frame_scores(video, w["frames"], w["return_frame"]),
                 **baselines.baseline_scores(w["frames"], w["return_frame"])})
  return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--clips", type=int, default=16)
  p.add_argument("--steps", default="1,2,4,10,20")
  p.add_argument("--shifts", default="1,3")
  p.add_argument("--out")
  a = p.parse_args(argv)
  steps = [int(s) for s in a.steps.split(",")]
  shifts = [float(s) for s in a.shifts.split(",")]
  if a.clips < 2 or min(steps) < 1 or min(shifts) <= 0:
    p.error(f"--clips={a.clips} must be >= 2, --steps={a.steps} >= 1, --shifts={a.shifts} > 0")
  config, model, variables, step = load_model(a.checkpoint)
  apply_fn = memory_gain.model_apply_fn(model, variables["params"])
  res = {"checkpoint": a.checkpoint, "step": int(step), "velocity": {}, "sampling": {}}
  print(f"# Diagnosis of {a.checkpoint} (step {step})\n\n## Teacher-forced velocity error by noise level\n")
  print("| clips | history | " + " | ".join(f"t={t:g}" for t in LEVELS) + " |")
  print("|" + " --- |" * (len(LEVELS) + 2))
  for split in ("train", "eval"):
    batch = _batch(config, split, a.clips)
    for history in ("full", "first"):
      e = velocity_errors(config, apply_fn, batch, history)
      res["velocity"][f"{split}/{history}"] = e
      print(f"| {split} | {history} | " + " | ".join(f"{e[t]:.4f}" for t in LEVELS) + " |")
  probe = memory_gain.GainProbe(config, model, num_clips=a.clips)
  res["gain"] = probe(variables["params"])
  print("\nMemory gain (return frame, without / with the first view): "
        + ", ".join(f"{k} {v:.2f}" for k, v in res["gain"].items()))
  print("\n## Sampling (eval loops)\n")
  cols = ("return_psnr", "return_ssim", "between_psnr", "psnr", "mean_return_psnr", "copy_between_psnr", "mean_psnr")
  print("| steps | shift | " + " | ".join(cols) + " |")
  print("|" + " --- |" * (len(cols) + 2))
  for s in steps:
    for sh in shifts:
      r = sampling_scores(config, model, variables, a.clips, s, sh)
      res["sampling"][f"{s}/{sh:g}"] = r
      print(f"| {s} | {sh:g} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |", flush=True)
  if a.out:
    pathlib.Path(a.out).write_text(json.dumps(res, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
