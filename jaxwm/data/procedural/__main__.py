"""Command line: preview a loop, or build the TFDS splits.

  python -m jaxwm.data.procedural --preview loop.gif
  python -m jaxwm.data.procedural --preview loop.mp4 --axes yaw+pitch --magnitude 90 --size 128 --frames 61
  python -m jaxwm.data.procedural --build data/tfds --config tiny
  python -m jaxwm.data.procedural --export data/smoke_videos --clips 4 --frames 41 --size 64
      # MP4s + RealEstate10K camera files + captions: a stand-in for your own videos (jaxwm.data.ingest's input)
"""

import argparse
import sys

import numpy as np

from jaxwm.data.procedural import trajectories as traj


def main(argv=None):
  p = argparse.ArgumentParser(prog="python -m jaxwm.data.procedural", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preview", help="write a GIF/MP4 of one clip (frames | depth) to this path")
  p.add_argument("--family", default="rotate_loop", choices=traj.FAMILIES + traj.WALKS)
  p.add_argument("--axes", default="yaw", choices=traj.AXIS_COMBOS)
  p.add_argument("--magnitude", type=float, default=90.0, help="rotate_loop peak angle in degrees")
  p.add_argument("--frames", type=int, default=61)
  p.add_argument("--size", type=int, default=128, help="square frame size in pixels")
  p.add_argument("--scene", type=int, default=0, help="scene seed")
  p.add_argument("--trajectory", type=int, default=0, help="trajectory seed")
  p.add_argument("--build", metavar="DATA_DIR", help="build the TFDS train/eval splits (array_record) here")
  p.add_argument("--config", default="tiny", help="TFDS builder config for --build")
  p.add_argument("--export", metavar="DIR", help="write --clips videos, camera files and captions here")
  p.add_argument("--clips", type=int, default=4, help="--export: number of clips")
  args = p.parse_args(argv)
  if not args.preview and not args.build and not args.export:
    p.error("give --preview PATH, --build DATA_DIR and/or --export DIR")
  if args.export:
    if args.clips < 1 or args.frames < 2 or args.size < 16 or args.size % 2:
      p.error(f"--export: --clips >= 1, --frames >= 2 and an even --size >= 16; got {args.clips}, {args.frames}, "
              f"{args.size}")
    from jaxwm.data.procedural.export import export  # pylint: disable=g-import-not-at-top
    stems = export(args.export, args.clips, args.frames, (args.size, args.size))
    print(f"wrote {len(stems)} videos of {args.frames} frames at {args.size}x{args.size} to {args.export}/videos, "
          f"their cameras (RealEstate10K) to {args.export}/cameras and captions to {args.export}/captions.jsonl")
  if args.preview:
    from jaxwm.data.procedural.clips import make_clip  # pylint: disable=g-import-not-at-top
    from jaxwm.utils.media import side_by_side, write_video  # pylint: disable=g-import-not-at-top
    clip = make_clip(args.scene, args.trajectory, args.frames, (args.size, args.size), args.family, args.axes,
                     args.magnitude)
    d = clip["depth"]
    depth_rgb = np.repeat((1.0 - np.clip(d / np.percentile(d, 99), 0, 1))[..., None], 3, -1)
    scale = max(1, 256 // args.size)
    path = write_video(args.preview, side_by_side(clip["frames"], depth_rgb), fps=12, scale=scale)
    print(f"wrote {path}: {clip['family']} {clip['axes']} {clip['magnitude_deg']:g} deg, {args.frames} frames, "
          f"return frame {clip['return_frame']} (left: frames, right: depth)")
  if args.build:
    from jaxwm.data.procedural.tfds_builder import build  # pylint: disable=g-import-not-at-top
    builder = build(args.build, args.config)
    print(f"built {builder.info.full_name} in {builder.data_dir}: "
          + ", ".join(f"{k}={v.num_examples}" for k, v in builder.info.splits.items()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
