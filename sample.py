"""Stream a video from a first frame and a camera trajectory with a trained jaxwm model.

  python sample.py --workdir runs/tiny                         # eval clip 0 (a rotation loop), GT side by side
  python sample.py --workdir runs/tiny --clip 7 --frames 17 --out samples/clip7.mp4
  python sample.py --workdir runs/tiny --image first.png --preset yaw90
  python sample.py --workdir runs/tiny --image first.png --trajectory cams.txt   # RealEstate10K format
  python sample.py --workdir runs/tiny --image first.png --preset yaw90 --frames 1001 --memory landmark

Writes the video (generated, or ground truth | generated) and a JSON of PSNR/SSIM per frame
and at the return pose.
"""

import argparse
import json
import pathlib
import sys

import numpy as np

from jaxwm.memory import POLICIES


def _load_image(path, size):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  im = Image.open(path).convert("RGB")
  s = min(im.size)
  left, top = (im.width - s) // 2, (im.height - s) // 2
  return np.asarray(im.crop((left, top, left + s, top + s)).resize((size, size), Image.BICUBIC))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", default="runs/tiny", help="training workdir or checkpoint directory")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  p.add_argument("--clip", type=int, default=0, help="procedural eval clip for the first frame and trajectory")
  p.add_argument("--image", help="first frame from an image file instead of a procedural clip")
  p.add_argument("--trajectory", help="RealEstate10K-format camera file")
  p.add_argument("--scale_divisor", type=float, default=None,
                 help="--trajectory translations are divided by this, as training divided its source's "
                      "(default: the checkpoint's data.scale_divisor)")
  p.add_argument("--preset", help="named trajectory, e.g. yaw90, yaw+pitch45")
  p.add_argument("--frames", type=int, default=None, help="frames to generate (1 + k * chunk); default: training clip")
  p.add_argument("--steps", type=int, default=None, help="Euler steps per chunk")
  p.add_argument("--shift", type=float, default=None)
  p.add_argument("--memory", default="full", choices=POLICIES,
                 help="which earlier frames each chunk attends to (bounded policies for long rollouts; docs/design.md §8)")
  p.add_argument("--window", type=int, default=8, help="--memory window: frames kept after the sink")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="samples/sample.gif", help=".gif or .mp4")
  args = p.parse_args(argv)

  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  try:
    config, model, variables, step = load_model(args.workdir, args.step)
  except FileNotFoundError as e:
    print(f"sample.py: {e}", file=sys.stderr)
    return 2

  import jax  # pylint: disable=g-import-not-at-top

  from jaxwm.evaluation.metrics import psnr, ssim  # pylint: disable=g-import-not-at-top
  from jaxwm.geometry import parse_realestate10k, reanchor, validate_cameras  # pylint: disable=g-import-not-at-top
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.clips import eval_clip, stream_clip  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.presets import preset_trajectory  # pylint: disable=g-import-not-at-top
  from jaxwm.utils.media import side_by_side, write_video  # pylint: disable=g-import-not-at-top

  d = config.data
  chunk = config.recipe.chunk_size
  frames_n = args.frames or d.num_frames
  if (frames_n - 1) % chunk:
    p.error(f"--frames must be 1 + k * {chunk}; got {frames_n}")
  size = d.image_size
  gt, ret = None, -1
  if args.image:
    first = _load_image(args.image, size)
    if args.trajectory:
      cams = parse_realestate10k(pathlib.Path(args.trajectory).read_text(), (size, size))
      if len(cams["c2w"]) < frames_n:
        p.error(f"{args.trajectory} has {len(cams['c2w'])} cameras; --frames asks for {frames_n}")
      c2w, k = reanchor(cams["c2w"][:frames_n]), cams["intrinsics"][:frames_n]
      divisor = args.scale_divisor if args.scale_divisor is not None else config.data.get("scale_divisor", 1.0)
      if divisor <= 0:
        p.error(f"--scale_divisor must be > 0; got {divisor}")
      c2w[:, :3, 3] /= divisor  # the training units of the model's poses
    else:
      c2w, k, ret = preset_trajectory(args.preset or "yaw90", frames_n, (size, size))
    clip = {"frames": first[None], "c2w": c2w, "intrinsics": k}
  else:
    if args.trajectory or args.preset:
      p.error("--trajectory/--preset need --image (a procedural clip brings its own trajectory)")
    clip = eval_clip(config, args.clip, num_frames=frames_n)
    gt, ret, meta = clip["frames"], clip["return_frame"], clip["meta"]
    first = gt[0]
    print(f"eval clip {args.clip}: {meta['family']} {meta['axes']} {meta['magnitude_deg']:g} deg")
  validate_cameras(clip["c2w"], clip["intrinsics"])
  if not model.cfg.camera_conditioned:
    print("note: this model uses 3D RoPE only (no camera encoding); the trajectory sets the length and the "
          "ground truth, not the generation")

  kwargs = {"window": args.window} if args.memory == "window" else {}
  memory = make_policy(args.memory, max_frames=frames_n, chunk_frames=chunk, image_hw=(size, size), **kwargs)
  video = stream_clip(model, variables, config, clip, key=jax.random.key(args.seed), num_steps=args.steps,
                      shift=args.shift, memory=memory, progress=True)
  out_path = pathlib.Path(args.out)
  write_video(out_path, video if gt is None else side_by_side(gt, video), fps=6, scale=max(1, 128 // size))
  report = {"checkpoint_step": int(step), "frames": frames_n, "return_frame": int(ret), "memory": args.memory}
  if gt is not None:
    report["psnr"] = [float(x) for x in psnr(video, gt)]
    report["ssim"] = [float(x) for x in ssim(video, gt)]
  if ret >= 0:
    report["loop_closure_psnr"] = float(psnr(video[ret], first))  # return pose vs the given first frame
    report["loop_closure_ssim"] = float(ssim(video[ret], first))
  json_path = out_path.with_suffix(".json")
  json_path.write_text(json.dumps(report, indent=1))
  print(f"wrote {out_path} and {json_path}" + (f" (loop-closure PSNR {report['loop_closure_psnr']:.2f} dB)"
                                               if ret >= 0 else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
