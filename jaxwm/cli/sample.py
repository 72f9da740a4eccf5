"""Stream a video from a first frame and a camera trajectory with a trained jaxwm model (``python sample.py`` in a
checkout, ``jaxwm-sample`` once installed: the same).

  python sample.py --workdir runs/tiny                         # eval clip 0 (a rotation loop), GT side by side
  python sample.py --workdir runs/tiny --clip 7 --frames 17 --out samples/clip7.mp4
  python sample.py --workdir runs/tiny --image first.png --preset yaw90
  python sample.py --workdir runs/tiny --image first.png --trajectory cams.txt   # RealEstate10K format
  python sample.py --workdir runs/tiny --image first.png --preset yaw90 --frames 1001 --memory landmark
  python sample.py --workdir runs/wan --image first.png --trajectory cams.txt --prompt "a kitchen" --out k.mp4
      # a model trained on ingested VAE latents: an MP4 decoded by the VAE as the chunks stream

Writes the video (generated, or ground truth | generated) and a JSON of PSNR/SSIM per frame
and at the return pose (strict JSON: an infinite PSNR, identical frames, is written as null).

Outputs never replace earlier ones: without ``--out`` the video gets a new name,
``samples/<run>_step<k>_<clip<c> | image_preset>_<n>.gif`` (the first free ``n``); an existing
``--out`` (or its ``.json``) is refused unless ``--overwrite``. Every argument is checked before
the checkpoint is restored or anything is written or compiled: a refusal is one line
``sample.py: ...`` and exit code 2. Defaults taken and trajectories cut are said in one line.
"""

import argparse
import pathlib
import sys

import numpy as np

from jaxwm.settings import Choice, Float, Int
from jaxwm.utils.cli import MAX_SEED, SEED, IsDir, IsFile, Parser, Refusal, refuse, run_dir, write_json
from jaxwm.utils.cli import run as run_cli

from jaxwm.memory import POLICIES

VIDEO_SUFFIXES = (".gif", ".mp4")


def _load_image(path, size):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  im = Image.open(path).convert("RGB")
  s = min(im.size)
  left, top = (im.width - s) // 2, (im.height - s) // 2
  return np.asarray(im.crop((left, top, left + s, top + s)).resize((size, size), Image.BICUBIC))


def _taken(path):
  return path.exists() or path.with_suffix(".json").exists()


def _free_name(base, suffix=".gif"):
  """``<base>_<n><suffix>`` with the first ``n`` whose video and JSON are both absent."""
  n = 0
  while _taken(pathlib.Path(f"{base}_{n}{suffix}")):
    n += 1
  return pathlib.Path(f"{base}_{n}{suffix}")


def _parser():
  p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", default="runs/tiny", help="training workdir or checkpoint directory")
  p.add_argument("--step", type=int, default=None, check=Int(0, allowed="must be >= 0 (a saved step; default: the latest)"), help="checkpoint step (default: latest)")
  p.add_argument("--clip", type=int, default=0, check=Int(0, allowed="must be >= 0 (an eval clip index)"), help="procedural eval clip (>= 0) for the first frame and trajectory")
  p.add_argument("--family", default="loops", check=Choice(("loops", "walks")),
                 help="eval clips: loops (the 35 rotation loops) or walks (translations: forward, backward, sideways, "
                      "orbit, move_rotate)")
  p.add_argument("--image", check=IsFile(), help="first frame from an image file instead of a procedural clip")
  p.add_argument("--trajectory", check=IsFile(), help="RealEstate10K-format camera file (needs --image)")
  p.add_argument("--scale_divisor", type=float, default=None, check=Float(gt=0),
                 help="--trajectory translations are divided by this, as training divided its source's "
                      "(default: the checkpoint's data.scale_divisor)")
  p.add_argument("--preset", help="named trajectory (needs --image), e.g. yaw90, yaw+pitch45 (default with --image: "
                                  "yaw90)")
  p.add_argument("--frames", type=int, default=None,
                 check=Int(2, allowed="must be 1 + k * chunk_size with k >= 1 (the first frame plus at least one "
                                      "generated chunk)"),
                 help="frames to generate, 1 + k * chunk with k >= 1 (default: the training clip)")
  p.add_argument("--steps", type=int, default=None, check=Int(1), help="Euler steps per chunk, >= 1 (default: the checkpoint's)")
  p.add_argument("--shift", type=float, default=None, check=Float(gt=0), help="timestep shift, > 0 (default: the checkpoint's)")
  p.add_argument("--noise-scale", type=float, default=None, check=Float(gt=0),
                 help="scale of each chunk's starting noise, > 0 (default: the checkpoint's, 1, or the adapter's)")
  p.add_argument("--memory", default="full", check=Choice(lambda: tuple(POLICIES)),
                 help="which earlier frames each chunk attends to (bounded policies for long rollouts; docs/design.md §8)")
  p.add_argument("--window", type=int, default=None, check=Int(1), help="--memory window: frames kept after the sink (default 8)")
  p.add_argument("--seed", type=int, default=0, check=SEED, help=f"noise seed in [0, {MAX_SEED}]")
  p.add_argument("--out", default=None, help="output video, .gif or .mp4 (default: a new name under samples/)")
  p.add_argument("--fps", type=float, default=None, check=Float(gt=0),
                 help="frames per second of the output (default: the ingested videos' rate for a records-trained "
                      "model, else 6)")
  p.add_argument("--overwrite", action="store_true", help="replace an existing --out and its .json")
  p.add_argument("--prompt", default=None, help="text prompt (text-conditioned models, trained on ingested records)")
  p.add_argument("--adapter", default=None, check=IsDir("a distillation workdir or its adapter/"),
                 help="a distilled LoRA adapter (a distillation workdir, its adapter/ or one step of it), merged into "
                      "the model; its few-step settings become the defaults of --steps, --shift and --guidance")
  p.add_argument("--guidance", type=float, default=None, check=Float(gt=0),
                 help="classifier-free guidance scale on the text, > 0 (default: the checkpoint's sample.guidance)")
  return p


def _check_args(args):
  """The checks across flags (each flag's own ran when parsing): all before anything is restored or written."""
  if (args.trajectory or args.preset) and not args.image:
    raise Refusal("--trajectory/--preset need --image (a procedural clip brings its own trajectory)")
  if args.family != "loops" and args.image:
    raise refuse("--family", args.family, "chooses a procedural eval clip; --image brings its own first frame")
  if args.trajectory and args.preset:
    raise Refusal(f"--trajectory={args.trajectory!r} and --preset={args.preset!r}: give one of them")
  if args.scale_divisor is not None and not args.trajectory:
    raise refuse("--scale_divisor", args.scale_divisor, "applies to --trajectory only")
  if args.preset:
    from jaxwm.sampling.presets import preset_trajectory  # pylint: disable=g-import-not-at-top
    try:
      preset_trajectory(args.preset, 3, (8, 8))
    except ValueError as e:
      raise refuse("--preset", args.preset, e) from None
  if args.image:
    try:
      _load_image(args.image, 8)
    except Exception as e:  # pylint: disable=broad-except  (PIL raises several kinds for a non-image)
      raise refuse("--image", args.image, f"not a readable image ({type(e).__name__}: {e})") from None
  if args.out is not None:
    out = pathlib.Path(args.out)
    if out.suffix.lower() not in VIDEO_SUFFIXES:
      raise refuse("--out", args.out, "must end in .gif or .mp4")
    if out.is_dir():
      raise refuse("--out", args.out, "is a directory")
    if _taken(out) and not args.overwrite:
      existing = out if out.exists() else out.with_suffix(".json")
      raise refuse("--out", args.out, f"{existing} exists; pass --overwrite to replace it or choose another --out")


def _main(argv):
  p = _parser()
  args = p.parse_args(argv)
  _check_args(args)

  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  try:
    config, model, variables, step = load_model(args.workdir, args.step)
  except (FileNotFoundError, ValueError) as e:
    raise Refusal(e) from None
  lora_tag = ""
  if args.adapter is not None:  # merged once: the streaming forward is unchanged
    from jaxwm.distill.student import adapter_flag  # pylint: disable=g-import-not-at-top
    variables, lora_tag = adapter_flag(config, variables, args.adapter, "sample.py")
  if args.noise_scale is not None:  # the samplers read config.sample
    with config.sample.unlocked():
      config.sample.noise_scale = float(args.noise_scale)

  import jax  # pylint: disable=g-import-not-at-top

  from jaxwm.evaluation.metrics import psnr, ssim  # pylint: disable=g-import-not-at-top
  from jaxwm.geometry import parse_realestate10k, reanchor, validate_cameras  # pylint: disable=g-import-not-at-top
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.data.sources import data_of  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.clips import eval_clip, stream_clip  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.presets import preset_trajectory  # pylint: disable=g-import-not-at-top
  from jaxwm.evaluation import baselines  # pylint: disable=g-import-not-at-top
  from jaxwm.utils.media import labelled, pose_captions, write_video  # pylint: disable=g-import-not-at-top

  d = config.data
  chunk = config.recipe.chunk_size
  said = []  # defaults taken, said in one line
  frames_n = args.frames
  if frames_n is None:
    frames_n = d.num_frames
    said.append(f"--frames {frames_n} (the training clip)")
  if frames_n < 1 + chunk or (frames_n - 1) % chunk:
    ok = ", ".join(str(1 + k * chunk) for k in range(1, 4))
    raise refuse("--frames", frames_n, f"must be 1 + k * {chunk} (the checkpoint's recipe.chunk_size) with k >= 1: "
                 f"{ok}, ...")
  steps = args.steps
  if steps is None:
    steps = config.sample.num_steps
    said.append(f"--steps {steps}")
  shift = args.shift
  if shift is None:
    shift = config.sample.shift
    said.append(f"--shift {shift:g}")
  window = args.window
  if args.memory == "window" and window is None:
    window = 8
    said.append("--window 8")
  elif args.memory != "window" and window is not None:
    raise refuse("--window", window, f"applies to --memory window only (got --memory {args.memory})")
  if d.get("source") == "records":  # VAE latents: an MP4 decoded chunk by chunk
    from jaxwm.cli.sample_video import sample_latent_model  # pylint: disable=g-import-not-at-top
    return sample_latent_model(args, config, model, variables, step, frames_n, steps, shift, window, said)
  if args.prompt:
    raise refuse("--prompt", args.prompt, "this model renders procedural frames without text")
  size = d.image_size
  gt, ret = None, -1
  if args.image:
    first = _load_image(args.image, size)
    if args.trajectory:
      try:
        cams = parse_realestate10k(pathlib.Path(args.trajectory).read_text(), (size, size))
      except (ValueError, UnicodeDecodeError) as e:
        raise refuse("--trajectory", args.trajectory, e) from None
      n_cams = len(cams["c2w"])
      if n_cams < frames_n:
        raise refuse("--trajectory", args.trajectory, f"has {n_cams} cameras; --frames asks for {frames_n}")
      if n_cams > frames_n:
        print(f"sample.py: {args.trajectory} has {n_cams} cameras; using the first {frames_n} (--frames)")
      c2w, k = reanchor(cams["c2w"][:frames_n]), cams["intrinsics"][:frames_n]
      divisor = args.scale_divisor
      if divisor is None:
        divisor = data_of(config.data).scale_divisor
        said.append(f"--scale_divisor {divisor:g} (the checkpoint's data.scale_divisor)")
      c2w[:, :3, 3] /= divisor  # the training units of the model's poses
      source = f"{pathlib.Path(args.image).stem}_{pathlib.Path(args.trajectory).stem}"
    else:
      preset = args.preset
      if preset is None:
        preset = "yaw90"
        said.append("--preset yaw90")
      c2w, k, ret = preset_trajectory(preset, frames_n, (size, size))
      source = f"{pathlib.Path(args.image).stem}_{preset}"
    clip = {"frames": first[None], "c2w": c2w, "intrinsics": k}
  else:
    clip = eval_clip(config, args.clip, num_frames=frames_n, family=args.family)
    gt, ret, meta = clip["frames"], clip["return_frame"], clip["meta"]
    first = gt[0]
    source = f"clip{args.clip}" if args.family == "loops" else f"{args.family}{args.clip}"
    print(f"eval clip {args.clip}: {meta['family']} {meta['axes']} {meta['magnitude_deg']:g} deg")
  try:
    validate_cameras(clip["c2w"], clip["intrinsics"])
  except ValueError as e:
    raise Refusal(f"cameras: {e}") from None
  kwargs = {"window": window} if args.memory == "window" else {}
  try:
    memory = make_policy(args.memory, max_frames=frames_n, chunk_frames=chunk, image_hw=(size, size), **kwargs)
  except (ValueError, TypeError) as e:
    raise refuse("--memory", args.memory, e) from None
  base = pathlib.Path("samples") / f"{(run_dir(args.workdir).name or 'run')}_step{step}{lora_tag}_{source}"
  out_path = pathlib.Path(args.out) if args.out is not None else _free_name(base)
  if args.out is None:
    said.append(f"--out {out_path} (a new name)")
  if said:
    print("sample.py: defaults: " + ", ".join(said))
  if not model.cfg.camera_conditioned:
    print("note: this model uses 3D RoPE only (no camera encoding); the trajectory sets the length and the "
          "ground truth, not the generation")

  video = stream_clip(model, variables, config, clip, key=jax.random.key(args.seed), num_steps=steps, shift=shift,
                      memory=memory, progress=True)
  if args.out is None and _taken(out_path):  # another run took the name meanwhile
    out_path = _free_name(base)
    print(f"sample.py: the name was taken meanwhile; writing {out_path}")
  elif args.out is not None and _taken(out_path) and not args.overwrite:
    out_path = _free_name(out_path.with_suffix(""), out_path.suffix)
    print(f"sample.py: {args.out} appeared meanwhile; writing {out_path} instead")
  report = {"checkpoint_step": int(step), "frames": frames_n, "return_frame": int(ret), "memory": args.memory,
            "steps": int(steps), "shift": float(shift), "seed": args.seed, "adapter": args.adapter}
  if gt is not None:
    report["psnr"] = [float(x) for x in psnr(video, gt)]  # frame 0 is the given frame: often inf, written as null
    report["ssim"] = [float(x) for x in ssim(video, gt)]
  if ret >= 0:
    report["loop_closure_psnr"] = float(psnr(video[ret], first))  # return pose vs the given first frame
    report["loop_closure_ssim"] = float(ssim(video[ret], first))
  summary = ""
  if gt is not None:
    report["scores"] = baselines.frame_scores(video, gt, ret)
    report["baselines"] = baselines.baseline_scores(gt, ret)
    sc, bl = report["scores"], report["baselines"]
    summary = f"all frames PSNR {sc['psnr']:.2f} dB (mean-colour baseline {bl['mean_psnr']:.2f})"
    if "return_psnr" in sc:
      summary += (f"; return frame PSNR {sc['return_psnr']:.2f} dB / SSIM {sc['return_ssim']:.3f} "
                  f"(mean colour {bl['mean_return_psnr']:.2f} / {bl['mean_return_ssim']:.3f})")
    if "between_psnr" in sc:
      summary += f"; in between PSNR {sc['between_psnr']:.2f} dB (copy first {bl['copy_between_psnr']:.2f})"
    if ret != 1:  # frames in between (no return frame: every generated frame)
      from jaxwm.evaluation import covisible  # pylint: disable=g-import-not-at-top
      d = config.data
      cs, per_frame = covisible.clip_scores(video, gt, meta["source"], clip["frame_index"],
                                            d.render_size // d.image_size, range(1, ret if ret >= 1 else frames_n))
      report["covisible"] = {**cs, "per_frame": per_frame}
      if cs["covis_psnr"] is None:
        summary += "; co-visible: no frame keeps 5% of the first view in sight (no score)"
      else:
        summary += (f"; co-visible PSNR {cs['covis_psnr']:.2f} dB over {cs['covis_frames']} frames (depth warp "
                    f"{cs['warp_covis_psnr']:.2f}, mean colour {cs['mean_covis_psnr']:.2f}, copy "
                    f"{cs['copy_covis_psnr']:.2f})")
  elif ret >= 0:
    summary = f"loop-closure PSNR {report['loop_closure_psnr']:.2f} dB"
  panels = {"generated": video} if gt is None else {"ground truth": gt, "generated": video}
  write_video(out_path, labelled(panels, pose_captions(clip["c2w"]), scale=max(1, 128 // size)), fps=args.fps or 6)
  json_path = out_path.with_suffix(".json")
  write_json(json_path, report)
  print(f"wrote {out_path} and {json_path}" + (f": {summary}" if summary else ""))
  return 0


def main(argv=None):
  """``python sample.py ARGV`` / ``jaxwm-sample ARGV`` (``argv`` without the program name; default ``sys.argv[1:]``);
  returns the exit code (2: a refused argument, nothing written)."""
  return run_cli(_main, argv, "sample.py")


if __name__ == "__main__":
  sys.exit(main())
