"""Ground truth | full memory | first view evicted, on one rotation loop: the GIF that shows what memory buys.

  python benchmarks/loop_gif.py --checkpoint runs/tiny --clip 4 --out results/default_clip4.gif

The same model and noise stream twice: with its full cache, and with a sliding window of the last
``--window`` frames and no sink (the first view gone when the camera returns). Frames are labelled
with their index and the camera's rotation from frame 0; scores print per stream.
"""

import argparse
import pathlib
import sys

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from jaxwm.evaluation import baselines  # pylint: disable=wrong-import-position
from jaxwm.memory import make_policy  # pylint: disable=wrong-import-position
from jaxwm.sampling import clips as clips_lib  # pylint: disable=wrong-import-position
from jaxwm.sampling.load import load_model  # pylint: disable=wrong-import-position
from jaxwm.utils.media import labelled, pose_captions, write_video  # pylint: disable=wrong-import-position


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--clip", type=int, default=4, help="eval loop (4: 180 degrees of yaw)")
  p.add_argument("--window", type=int, default=2)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  if a.clip < 0 or a.window < 1 or not a.out.endswith((".gif", ".mp4")):
    p.error(f"--clip={a.clip} must be >= 0, --window={a.window} >= 1, --out={a.out!r} a .gif or .mp4")
  config, model, variables, step = load_model(a.checkpoint)
  w = clips_lib.eval_clip(config, a.clip)
  n, chunk, size = len(w["c2w"]), config.recipe.chunk_size, config.data.image_size
  panels = {"ground truth": w["frames"]}
  for name, policy in (("full memory", make_policy("full", max_frames=n, chunk_frames=chunk, image_hw=(size, size))),
                       ("first view evicted", make_policy("window", max_frames=n, chunk_frames=chunk,
                                                          image_hw=(size, size), sink=0, window=a.window))):
    video = clips_lib.stream_clip(model, variables, config, w, key=jax.random.key(a.seed), memory=policy)
    s = baselines.frame_scores(video, w["frames"], w["return_frame"])
    print(f"{name}: return PSNR {s.get('return_psnr', float('nan')):.2f} dB, SSIM {s.get('return_ssim', float('nan')):.3f}; "
          f"all frames {s['psnr']:.2f} dB")
    panels[name] = video
  meta = w["meta"]
  print(f"clip {a.clip}: {meta['axes']} {meta['magnitude_deg']:g} deg, step {step}")
  write_video(a.out, labelled(panels, pose_captions(w["c2w"]), scale=4), fps=3)
  print(f"wrote {a.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
