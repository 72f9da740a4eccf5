"""How much of the return frame's error depends on the noise seed: a distilled student against its teacher.

  python benchmarks/return_grain.py --checkpoint runs/tiny --adapter runs/tiny_distill_r64_s1_long/adapter/600 \
      --clips 8 --seeds 3 --png results/fewstep_s1_return_seeds_r64_step600.png

For each of the first ``--clips`` eval loops, the teacher (at ``--reference-steps``) and the student (the adapter
merged, at its own step count) stream the loop with ``--seeds`` noise keys, full memory. At the return frame
(whose ground truth is the first view) it prints, averaged over loops:

- ``psnr``: the mean of the single-seed return PSNRs;
- ``psnr_seed_mean``: the PSNR of the seeds' mean frame (what averaging removes is seed-dependent error);
- ``hf_corr_seeds``: the correlation between seeds of the frames' high-pass parts (the frame minus its Gaussian
  blur, sigma ``--sigma`` pixels, per channel, mean removed); 1 means the fine detail does not depend on the seed;
- ``hf_energy`` / ``hf_energy_gt``: the mean square of the high-pass part of the prediction and of the ground truth;
- ``hf_corr_gt``: the correlation of the prediction's high-pass part with the ground truth's;
- ``err_low`` / ``err_high``: the mean square of the error's low-pass and high-pass parts (after removing the
  error's per-channel mean, the brightness offset).

``--png`` writes one row per loop (at most 4): ground truth | teacher, seeds 0 and 1 | student, seeds 0 and 1 |
the student's seed mean, 4x nearest-neighbour.
"""

import argparse
import copy
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from jaxwm.distill.student import apply_adapter  # pylint: disable=wrong-import-position
from jaxwm.sampling import clips as clips_lib  # pylint: disable=wrong-import-position
from jaxwm.sampling.load import load_model  # pylint: disable=wrong-import-position


def gaussian_blur(x, sigma):
  """``[H, W, C]`` float64 blurred by a separable Gaussian (reflect padding)."""
  r = max(1, int(3 * sigma))
  k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
  k /= k.sum()
  x = np.pad(x, ((r, r), (r, r), (0, 0)), mode="reflect")
  x = np.apply_along_axis(lambda v: np.convolve(v, k, "valid"), 0, x)
  return np.apply_along_axis(lambda v: np.convolve(v, k, "valid"), 1, x)


def high_pass(x, sigma):
  x = x - x.mean((0, 1))
  return x - gaussian_blur(x, sigma)


def corr(a, b):
  return float(np.sum(a * b) / np.sqrt(np.sum(a * a) * np.sum(b * b)))


def psnr(a, b):
  return float(10 * np.log10(255.0**2 / np.mean((a - b) ** 2)))


def scores(frames, gt, sigma):
  """The columns of the module docstring for one loop: ``frames`` ``[S, H, W, C]`` float64 (one per seed)."""
  hp = [high_pass(f, sigma) for f in frames]
  hg = high_pass(gt, sigma)
  pairs = [(i, j) for i in range(len(frames)) for j in range(i + 1, len(frames))]
  err = [f - gt for f in frames]
  err = [e - e.mean((0, 1)) for e in err]
  low = [gaussian_blur(e, sigma) for e in err]
  return {"psnr": np.mean([psnr(f, gt) for f in frames]), "psnr_seed_mean": psnr(np.mean(frames, 0), gt),
          "hf_corr_seeds": np.mean([corr(hp[i], hp[j]) for i, j in pairs]) if pairs else float("nan"),
          "hf_energy": np.mean([np.mean(h * h) for h in hp]), "hf_energy_gt": float(np.mean(hg * hg)),
          "hf_corr_gt": np.mean([corr(h, hg) for h in hp]),
          "err_low": np.mean([np.mean(lo * lo) for lo in low]),
          "err_high": np.mean([np.mean((e - lo) ** 2) for e, lo in zip(err, low)])}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True, help="the teacher's training workdir")
  p.add_argument("--adapter", required=True, help="the distillation workdir, its adapter/ or one step's directory")
  p.add_argument("--clips", type=int, default=8)
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--reference-steps", type=int, default=10)
  p.add_argument("--sigma", type=float, default=1.5)
  p.add_argument("--png", default=None)
  a = p.parse_args(argv)
  if a.clips < 1 or a.seeds < 2 or a.reference_steps < 1 or a.sigma <= 0:
    p.error(f"--clips={a.clips} must be >= 1, --seeds={a.seeds} >= 2, --reference-steps={a.reference_steps} >= 1, "
            f"--sigma={a.sigma} > 0")
  if a.png is not None and not a.png.endswith(".png"):
    p.error(f"--png={a.png!r} must end in .png")
  config, model, variables, _ = load_model(a.checkpoint)
  student_config = copy.deepcopy(config)
  student_vars, note = apply_adapter(student_config, variables, a.adapter)
  print(note)
  runs = {f"teacher, {a.reference_steps} steps": (variables, config, a.reference_steps),
          f"student, {int(student_config.sample.num_steps)} step(s)": (student_vars, student_config,
                                                                       int(student_config.sample.num_steps))}
  rows, panels = {name: [] for name in runs}, []
  for clip in range(a.clips):
    w = clips_lib.eval_clip(config, clip)
    r = int(w["return_frame"])
    gt = w["frames"][r].astype(np.float64)
    got = {}
    for name, (v, c, steps) in runs.items():
      got[name] = np.stack([np.asarray(clips_lib.stream_clip(model, v, c, w, key=jax.random.key(s), num_steps=steps,
                                                             shift=float(c.sample.shift)))[r]
                            for s in range(a.seeds)]).astype(np.float64)
      rows[name].append(scores(got[name], gt, a.sigma))
    print(f"clip {clip}: " + "; ".join(f"{n} {rows[n][-1]['psnr']:.2f} dB (seed mean "
                                       f"{rows[n][-1]['psnr_seed_mean']:.2f})" for n in runs), flush=True)
    if len(panels) < 4:
      (t, s) = got.values()
      panels.append(np.concatenate([gt, t[0], t[1], s[0], s[1], s.mean(0)], 1))
  for name, rs in rows.items():
    print(f"{name}: " + ", ".join(f"{k} {np.mean([x[k] for x in rs]):.3f}" for k in rs[0]))
  if a.png:
    from PIL import Image  # pylint: disable=g-import-not-at-top
    img = np.clip(np.concatenate(panels, 0).round(), 0, 255).astype(np.uint8)
    pathlib.Path(a.png).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).resize((img.shape[1] * 4, img.shape[0] * 4), Image.NEAREST).save(a.png)
    print(f"wrote {a.png}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
