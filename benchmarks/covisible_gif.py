"""Ground truth | generated | depth warp of frame 0, with the co-visible region outlined: does the model see?

  python benchmarks/covisible_gif.py --checkpoint runs/tiny --clip 0 --out results/covis_yaw30.gif
  python benchmarks/covisible_gif.py --checkpoint runs/tiny --family walks --clip 2 --out results/covis_sideways.gif

The outline (yellow) encloses the pixels that ground-truth depth says are visible and unoccluded in the
first frame (:mod:`jaxwm.evaluation.covisible`); outside it the scene is newly revealed. The depth warp is
what seeing perfectly gives inside the outline. Also writes ``<out>.png``: every frame of the three rows
(the picture to look at without a GIF player). Per-frame co-visible PSNR prints for the model and the
references.
"""

import argparse
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from jaxwm.evaluation import covisible  # pylint: disable=wrong-import-position
from jaxwm.sampling import clips as clips_lib  # pylint: disable=wrong-import-position
from jaxwm.sampling.load import load_model  # pylint: disable=wrong-import-position
from jaxwm.utils.media import labelled, pose_captions, write_video  # pylint: disable=wrong-import-position

OUTLINE = np.array([255, 220, 0], np.uint8)


def outline(frames, masks, scale):
  """Upscales ``frames [F, H, W, 3]`` by ``scale`` and draws the boundary of ``masks [F, H, W]`` on them."""
  up = frames.repeat(scale, 1).repeat(scale, 2).copy()
  m = masks.repeat(scale, 1).repeat(scale, 2)
  edge = np.zeros_like(m)
  edge[:, 1:] |= m[:, 1:] != m[:, :-1]
  edge[:, :, 1:] |= m[:, :, 1:] != m[:, :, :-1]
  up[edge] = OUTLINE
  return up


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--family", default="loops", choices=("loops", "walks"))
  p.add_argument("--clip", type=int, default=0, help="eval clip (loops: 0 is 30 degrees of yaw, 1 is 45)")
  p.add_argument("--steps", type=int, help="Euler steps per chunk (default: the checkpoint's)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--scale", type=int, default=4)
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  if a.clip < 0 or a.scale < 1 or (a.steps is not None and a.steps < 1) or not a.out.endswith((".gif", ".mp4")):
    p.error(f"--clip={a.clip} must be >= 0, --scale={a.scale} >= 1, --steps={a.steps} >= 1, --out={a.out!r} a "
            ".gif or .mp4")
  config, model, variables, step = load_model(a.checkpoint)
  d = config.data
  w = clips_lib.eval_clip(config, a.clip, family=a.family)
  src, gt, ret = w["meta"]["source"], w["frames"], w["return_frame"]
  sl, factor = w["frame_index"], d.render_size // d.image_size
  video = clips_lib.stream_clip(model, variables, config, w, key=jax.random.key(a.seed), num_steps=a.steps)
  cov, rev, _ = covisible.covisible_masks(src["depth"][sl], src["c2w"][sl], src["intrinsics"][sl], factor)
  warp = covisible.warp_reference(src["frames"][sl], src["depth"][sl], src["c2w"][sl], src["intrinsics"][sl], factor)
  warp = np.where(cov[..., None], np.clip(np.rint(warp), 0, 255), 0).astype(np.uint8)
  refs = covisible.frame_references(gt[0], warp, len(gt))
  frames = range(1, ret) if ret >= 1 else range(1, len(gt))
  per_frame = covisible.score_frames(video, gt, cov, rev, refs, frames)
  meta = w["meta"]
  print(f"{a.family} clip {a.clip}: {meta['family']} {meta['axes']} {meta['magnitude_deg']:g} deg, step {step}")
  fmt = lambda v: "   -  " if v is None else f"{v:6.2f}"
  print("frame  co-visible  model   warp   copy   mean (dB)")
  for r in per_frame:
    print(f"{r['frame']:5d}  {100 * r['covis_fraction']:8.0f}%  {fmt(r['covis_psnr'])} {fmt(r['warp_covis_psnr'])} "
          f"{fmt(r['copy_covis_psnr'])} {fmt(r['mean_covis_psnr'])}")
  panels = {k: outline(v, cov, a.scale) for k, v in (("ground truth", gt), ("generated", video), ("depth warp", warp))}
  body = labelled(panels, pose_captions(w["c2w"]))
  write_video(a.out, body, fps=3)
  from PIL import Image  # pylint: disable=g-import-not-at-top
  sheet = np.concatenate([np.concatenate(list(panels[k]), axis=1) for k in panels], axis=0)
  png = pathlib.Path(a.out).with_suffix(".png")
  Image.fromarray(sheet).save(png)
  print(f"wrote {a.out} and {png} (rows: ground truth, generated, depth warp; yellow: co-visible outline)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
