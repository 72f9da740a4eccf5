"""``sample.py`` for models trained on ingested VAE latents (``data.source = "records"``): a first image, a
trajectory (RealEstate10K file, one camera per video frame, or a preset, one per latent frame) and a prompt
-> an MP4 decoded by the VAE chunk by chunk as the latents stream.
"""

import pathlib

import numpy as np

from jaxwm.utils.cli import Refusal, run_dir, write_json


def _image_hw(config, ae, image):
  """The frame size: the ingested dataset's when its manifest is readable, else the image's, floored to the
  autoencoder's stride."""
  from jaxwm.data.records import read_manifest  # pylint: disable=g-import-not-at-top
  try:
    manifest = read_manifest(pathlib.Path(config.data.data_dir).expanduser())
  except (OSError, ValueError):
    manifest = None
  if manifest and manifest.get("settings"):
    return int(manifest["settings"]["height"]), int(manifest["settings"]["width"])
  s = ae.spatial_stride
  return image.height // s * s, image.width // s * s


def _frame_rate(config):
  """The ingested videos' frame rate: the dataset's ``--fps`` (its manifest), else the first record's (its
  source's rate over ``--stride``); None when the dataset is not readable here."""
  import json  # pylint: disable=g-import-not-at-top
  from jaxwm.data.records import RecordClips, read_manifest  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(config.data.data_dir).expanduser()
  try:
    fps = ((read_manifest(path) or {}).get("settings") or {}).get("fps")
    if fps is None:
      fps = json.loads(str(RecordClips(path)[0]["meta"])).get("fps")
    return float(fps) if fps else None
  except (OSError, ValueError, KeyError, IndexError, TypeError):
    return None


def _load(path, hw):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  im = Image.open(path).convert("RGB")
  h, w = hw
  scale = max(h / im.height, w / im.width)
  im = im.resize((max(w, round(im.width * scale)), max(h, round(im.height * scale))), Image.BICUBIC)
  left, top = (im.width - w) // 2, (im.height - h) // 2
  return np.asarray(im.crop((left, top, left + w, top + h)))


def sample_latent_model(args, config, model, variables, step, frames_n, steps, shift, window, said):
  """Streams and writes the MP4 and its JSON; returns the exit code."""
  import jax  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from jaxwm.data.ingest import latent_cameras  # pylint: disable=g-import-not-at-top
  from jaxwm.geometry import parse_realestate10k, reanchor, validate_cameras  # pylint: disable=g-import-not-at-top
  from jaxwm.encoders import make_autoencoder  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.presets import preset_trajectory  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.video import stream_video, text_contexts  # pylint: disable=g-import-not-at-top
  from jaxwm.utils.media import write_video  # pylint: disable=g-import-not-at-top
  from jaxwm.data.sources import data_of  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.settings import sample_of  # pylint: disable=g-import-not-at-top

  if not args.image:
    raise Refusal("this model was trained on ingested latents (data.source='records'): pass --image (the first "
                  "frame) and --trajectory or --preset")
  try:
    ae = make_autoencoder(config.data.vae)
  except (ValueError, OSError) as e:
    raise Refusal(f"the checkpoint's data.vae: {e}") from None
  hw = _image_hw(config, ae, Image.open(args.image))
  first = _load(args.image, hw)
  n_pix = 1 + (frames_n - 1) * ae.temporal_stride
  if args.trajectory:
    try:
      cams = parse_realestate10k(pathlib.Path(args.trajectory).read_text(), hw)
    except (ValueError, UnicodeDecodeError) as e:
      raise Refusal(f"--trajectory={args.trajectory!r}: {e}") from None
    if len(cams["c2w"]) < n_pix:
      raise Refusal(f"--trajectory={args.trajectory!r}: has {len(cams['c2w'])} cameras; --frames {frames_n} latent "
                    f"frames need {n_pix} video frames ({ae.name}: {ae.temporal_stride} per latent frame)")
    c2w, k = latent_cameras(cams["c2w"][:n_pix], cams["intrinsics"][:n_pix], ae.temporal_stride)
    c2w = reanchor(c2w)
    divisor = args.scale_divisor or data_of(config.data).scale_divisor
    c2w[:, :3, 3] /= divisor
    source = f"{pathlib.Path(args.image).stem}_{pathlib.Path(args.trajectory).stem}"
  else:
    preset = args.preset or "yaw90"
    c2w, k, _ = preset_trajectory(preset, frames_n, hw)
    source = f"{pathlib.Path(args.image).stem}_{preset}"
  try:
    validate_cameras(c2w, k)
  except ValueError as e:
    raise Refusal(f"cameras: {e}") from None
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  kwargs = {"window": window} if args.memory == "window" else {}
  try:
    memory = make_policy(args.memory, max_frames=frames_n, chunk_frames=config.recipe.chunk_size, image_hw=hw,
                         **kwargs)
  except (ValueError, TypeError) as e:
    raise Refusal(f"--memory={args.memory}: {e}") from None
  context = null = None
  guidance = sample_of(config.sample).guidance if args.guidance is None else args.guidance
  if model.cfg.cross_attn:
    from jaxwm.encoders import make_text_encoder  # pylint: disable=g-import-not-at-top
    try:
      enc = make_text_encoder(config.data.text_encoder)
    except (ValueError, OSError) as e:
      raise Refusal(f"the checkpoint's data.text_encoder: {e}") from None
    context, null = text_contexts(enc, args.prompt or "")
  elif args.prompt:
    raise Refusal(f"--prompt={args.prompt!r}: this model has no text conditioning (model.cross_attn is off)")
  elif guidance != 1.0:
    raise Refusal(f"--guidance={guidance}: needs a text-conditioned model")
  out_path = pathlib.Path(args.out) if args.out else pathlib.Path("samples") / (
      f"{run_dir(args.workdir).name or 'run'}_step{step}_{source}.mp4")
  if args.out is None:
    said.append(f"--out {out_path}")
  fps = args.fps
  if fps is None:
    fps = _frame_rate(config)
    said.append(f"--fps {fps:g} (the ingested videos')" if fps else "--fps 8 (the ingested dataset is not readable "
                                                                   "here to take its rate)")
    fps = fps or 8.0
  if said:
    print("sample.py: defaults: " + ", ".join(said))
  latents, video = stream_video(model, variables, config, first, {"c2w": c2w, "intrinsics": k},
                                key=jax.random.key(args.seed), num_frames=frames_n, autoencoder=ae, context=context,
                                null_context=null, guidance=guidance, num_steps=steps, shift=shift, memory=memory,
                                progress=True)
  write_video(out_path, video, fps=fps)
  report = {"checkpoint_step": int(step), "frames": frames_n, "video_frames": int(len(video)), "vae": ae.name,
            "prompt": args.prompt or "", "guidance": float(guidance), "steps": int(steps), "shift": float(shift),
            "seed": args.seed, "memory": args.memory, "fps": float(fps), "latent_shape": list(latents.shape)}
  write_json(out_path.with_suffix(".json"), report)
  print(f"wrote {out_path} ({len(video)} frames decoded by {ae.name}) and {out_path.with_suffix('.json')}")
  return 0
