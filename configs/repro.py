"""The small reproduction of the papers' comparisons (issue 8; `benchmarks/reproduction.py` runs them all).

  python train.py --config configs/repro.py:viewrope --config.seed=1 --workdir runs/repro/viewrope_s1

Every arm is the tiny model (configs/tiny.py: same channels, same data, same steps); only the
named ingredient changes:

- camera encoding: ``rope3d`` (no camera), ``gta`` (GTA tiles on the 12 low temporal channels),
  ``viewrope`` (ViewRope on the same 12 channels; the tiny default);
- attention sparsity, all with ViewRope and the same history budget of 3 frames:
  ``sliding_window`` (the 3 latest history frames), ``frame_topk`` (the 3 most relevant, Eq. 9-12);
  ``viewrope`` is the dense arm;
- ``loci``: the LOCI hybrid (blocks 1 and 3 trade history softmax for delta-rule memory,
  chunk-wise diffusion forcing);
- ``viewrope_df``: the dense ViewRope arm trained with LOCI's diffusion-forcing layout, the
  softmax counterpart of ``loci`` (only the layout differs from ``viewrope``, only the memory from ``loci``);
- ``stage1`` .. ``stage4``: ViewRope §3.4's progressive recipe as a sequence of configs, each
  starting from the previous stage's parameters (``train.init_from``): I short clips, teacher
  forcing, no camera encoding; II ViewRope on; III frame-sparse attention on, moderate clips;
  IV twice the context (17 latent frames).

A second scale, ``<arm>,w384`` (e.g. ``configs/repro.py:gta,w384``), puts the same single change on the
CPU recipe (configs/recipe_cpu.py: width 384, 1024 clips, lr 2e-3 cosine to 0, 4 Euler steps), whose
models reconstruct the return view; ``benchmarks/reproduction.py --scale w384`` runs it. The progressive
stages exist at the tiny scale only.
"""

from configs import recipe_cpu, tiny

SCALES = ("tiny", "w384")
ARMS = ("rope3d", "gta", "viewrope", "sliding_window", "frame_topk", "loci", "viewrope_df",
        "stage1", "stage2", "stage3", "stage4")
BUDGET = 3  # history frames for sliding_window / frame_topk
STAGE_FRACTION = 0.25  # each progressive stage trains this share of train.num_steps


def get_config(arm="viewrope"):
  """``arm`` or ``arm,scale``: one of ARMS on the tiny model (default) or on the width-384 recipe."""
  arm, _, scale = arm.partition(",")
  scale = scale or "tiny"
  if arm not in ARMS:
    raise ValueError(f"configs/repro.py: arm must be one of {ARMS}; got {arm!r}")
  if scale not in SCALES:
    raise ValueError(f"configs/repro.py:{arm},{scale}: scale must be one of {SCALES}")
  if scale == "w384":
    if arm.startswith("stage"):
      raise ValueError(f"configs/repro.py:{arm},{scale}: the progressive stages exist at scale 'tiny' only")
    c = recipe_cpu.get_config("w384")  # its schedule, data, EMA and 4 Euler steps
    c.train.update(num_steps=3000, ckpt_every=1000, sample_every=0, workdir=f"runs/repro_w384/{arm}")
  else:
    c = tiny.get_config()
    c.train.update(num_steps=900, ckpt_every=300, sample_every=0, gain_every=500, workdir=f"runs/repro/{arm}")
    # What every arm's runs used (tiny's defaults until 2026-12-01: patch 2, EMA 0.999); the report samples with
    # --sample-steps.
    c.model.patch_size = (1, 2, 2)
    c.recipe.timestep_distribution = "uniform"
    c.model.camera.update(encoding="viewrope", channels="t_low")  # every arm's base (tiny's until 2026-12-02)
    c.recipe.layout = "teacher_forcing"
    c.optim.update(lr=1e-3, end_lr_ratio=0.1, ema_decay=0.999)
    c.sample.num_steps = 10
  c.model.attention.update(top_k=BUDGET, window=BUDGET)
  if arm in ("rope3d", "gta"):
    c.model.camera.encoding = arm
  elif arm in ("sliding_window", "frame_topk"):
    c.model.attention.sparsity = arm
  elif arm == "loci":
    c.model.loci.enabled = True
    c.recipe.layout = "diffusion_forcing"
  elif arm == "viewrope_df":
    c.recipe.layout = "diffusion_forcing"
  elif arm.startswith("stage"):
    n = int(arm[-1])
    c.train.num_steps = int(900 * STAGE_FRACTION)
    c.model.camera.encoding = "rope3d" if n == 1 else "viewrope"
    if n <= 2:
      c.data.num_frames = 5  # short clips
    if n >= 3:
      c.model.attention.sparsity = "frame_topk"
    if n == 4:  # scale the context: 17 latent frames from 33 rendered ones
      c.data.update(clip_frames=33, num_frames=17)
    if n > 1:
      c.train.init_from = f"runs/repro/stage{n - 1}"
  return c
