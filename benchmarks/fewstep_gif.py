"""Ground truth | teacher at N steps | student at N steps | teacher at many steps, on one eval loop: the GIF that
shows what few-step distillation buys.

  python benchmarks/fewstep_gif.py --checkpoint runs/tiny --adapter runs/tiny_distill_s1 --clip 4 \
      --out results/fewstep/clip4_steps1.gif

The same first frame, cameras and noise key for every panel, full memory. The student is the teacher with the
distilled LoRA adapter merged (:func:`jaxwm.distill.student.apply_adapter`), sampled at the adapter's step count
(``N``); the teacher is sampled at ``N`` and at ``--reference-steps``. Frames are labelled with their index and
the camera's rotation from frame 0; each panel's return-frame and all-frame PSNR print.
"""

import argparse
import copy
import pathlib
import sys

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from jaxwm.distill.student import apply_adapter  # pylint: disable=wrong-import-position
from jaxwm.evaluation import baselines  # pylint: disable=wrong-import-position
from jaxwm.sampling import clips as clips_lib  # pylint: disable=wrong-import-position
from jaxwm.sampling.load import load_model  # pylint: disable=wrong-import-position
from jaxwm.utils.media import labelled, pose_captions, write_video  # pylint: disable=wrong-import-position


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True, help="the teacher's training workdir")
  p.add_argument("--adapter", required=True, help="the distillation workdir (or its adapter/)")
  p.add_argument("--clip", type=int, default=4, help="eval loop (4: 180 degrees of yaw)")
  p.add_argument("--reference-steps", type=int, default=10)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  if a.clip < 0 or a.reference_steps < 1 or not a.out.endswith((".gif", ".mp4")):
    p.error(f"--clip={a.clip} must be >= 0, --reference-steps={a.reference_steps} >= 1, --out={a.out!r} a .gif "
            "or .mp4")
  config, model, variables, step = load_model(a.checkpoint)
  student_config = copy.deepcopy(config)
  student_vars, note = apply_adapter(student_config, variables, a.adapter)
  n_steps = int(student_config.sample.num_steps)
  print(note)
  w = clips_lib.eval_clip(config, a.clip)
  key = jax.random.key(a.seed)
  panels = {"ground truth": w["frames"]}
  runs = ((f"teacher, {n_steps} step{'s' * (n_steps > 1)}", variables, config, n_steps),
          (f"student, {n_steps} step{'s' * (n_steps > 1)}", student_vars, student_config, n_steps),
          (f"teacher, {a.reference_steps} steps", variables, config, a.reference_steps))
  for name, v, c, steps in runs:
    video = clips_lib.stream_clip(model, v, c, w, key=key, num_steps=steps, shift=float(c.sample.shift))
    s = baselines.frame_scores(video, w["frames"], w["return_frame"])
    print(f"{name}: return PSNR {s.get('return_psnr', float('nan')):.2f} dB, all frames {s['psnr']:.2f} dB")
    panels[name] = video
  meta = w["meta"]
  print(f"clip {a.clip}: {meta['axes']} {meta['magnitude_deg']:g} deg, teacher step {step}")
  pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
  write_video(a.out, labelled(panels, pose_captions(w["c2w"]), scale=4), fps=3)
  print(f"wrote {a.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
