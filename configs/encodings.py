"""The camera-encoding question on the co-visible score (issue 29; `benchmarks/encodings_covis.py` runs it).

  python train.py --config configs/encodings.py:prope --config.seed=1 --workdir runs/enc/prope_s1

Every arm is the default job's model (configs/tiny.py: patch 1, width 192, logit-normal timesteps, diffusion
forcing, 900 steps, the same data); only the camera encoding changes, each on the placement its paper uses:

- ``rope3d``: no camera (the backbone's 3D RoPE only);
- ``plucker``: rope3d plus per-token Plücker rays added to the patch embedding (ReWorld's action injection);
- ``gta``: GTA's SE(3) tiles on the 12 low temporal channels;
- ``prope``: PRoPE's projective tiles on the same channels (LOCI's conditioning);
- ``mrope``: ReWorld's MRoPE pose phases on the same channels;
- ``viewrope``: ViewRope's ray rotations on the same channels (the default until 2026-12-02);
- ``worldrope``: WorldRoPE's depth-Gaussian expected rotation on every h/w channel (its paper's placement).
"""

from configs import tiny

ARMS = ("rope3d", "plucker", "gta", "prope", "mrope", "viewrope", "worldrope")


def get_config(arm="worldrope"):
  """The default job with camera encoding ``arm`` (one of ARMS)."""
  if arm not in ARMS:
    raise ValueError(f"configs/encodings.py: arm must be one of {ARMS}; got {arm!r}")
  c = tiny.get_config()
  cam = c.model.camera
  cam.plucker = arm == "plucker"
  cam.encoding = "rope3d" if arm == "plucker" else arm
  cam.channels = "hw" if arm == "worldrope" else "t_low"
  c.train.update(sample_every=0, workdir=f"runs/enc/{arm}")
  return c
