"""The default tiny model on the built-in procedural scenes (trains on a 2-core CPU).

  python train.py --config configs/tiny.py --config.optim.lr=3e-4
"""

import ml_collections

from jaxwm.models.config import default_config_dict
from jaxwm.training.sharding import DEFAULT_RULES


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Model: the defaults of jaxwm.models.config (ModelConfig, CameraConfig, AttentionConfig and LociConfig document
  # every option and its valid values), then only the tiny model's overrides.
  # Rendered at 64x64, trained at 32x32; latents by space-to-depth (stride 4): 8x8x48; patch 1: 64 tokens per frame
  # of 4x4 pixels (48 values). Patch 2 (16 tokens of 8x8 pixels, 192 values; the default until 2026-12-02) learns
  # about ten times slower per step and cannot place detail inside a token; patch 1 costs 7.5x per step and still
  # wins in the same 20 minutes (RESULTS.md, "Do the models see?").
  c.model = ml_collections.ConfigDict(default_config_dict())
  c.model.update(dim=192, ffn_dim=384, patch_size=(1, 1, 1))
  # WorldRoPE on every h/w channel (docs/design.md §4): each key's spatial RoPE phase sits where its depth hypotheses
  # land in the query's view, so attention finds what is still in sight. Co-visible PSNR 26.9 dB against ViewRope's
  # 22.2 in the same 720 steps (RESULTS.md, "Do the models see?"); ViewRope was the default until 2026-12-02.
  c.model.camera.encoding = "worldrope"
  c.model.camera.channels = "hw"
  c.model.loci.blocks = (1, 3)  # hybrid blocks when model.loci.enabled (docs/design.md §7)
  c.data = ml_collections.ConfigDict(dict(
      source="tfds", data_dir="data/tfds", num_clips=256, clips_per_scene=8, clip_frames=17, render_size=64,
      image_size=32, latent_stride=4, num_frames=9, frame_stride=2, batch_size=0, per_device_batch_size=4,
      worker_count=0, palindrome_prob=0.25, scale_divisor=1.0, convention="opencv", vae="space_to_depth:4",
      text_encoder="none"))
  # data.source: tfds | procedural (rendered on the fly) | records (python -m jaxwm.data.ingest; data.data_dir is the
  # ingested folder, data.vae / data.text_encoder name the encoders it used: jaxwm.encoders).
  # data.batch_size: the global batch; 0 (the default) makes it per_device_batch_size x the devices the batch is
  # split over (mesh data x fsdp), so the default runs on 1, 2, 4 or 8 devices (train.py resolves and prints it).
  # layout: teacher_forcing (clean history + noisy chunks) | diffusion_forcing (every chunk noised independently).
  # Diffusion forcing (since 2026-12-02): 9-frame sequences instead of teacher forcing's 15 (7 clean + 8 noisy), so a
  # WorldRoPE step costs 0.9 s instead of 2.4 and 900 steps fit the 20 minutes (RESULTS.md, "Do the models see?").
  # ReWorld's recipe (docs/design.md §5): chunk drop keeps the sink + `keep` random past chunks; head windows give a
  # routed `global_fraction` of heads the whole history and the rest the last `window` frames.
  # Logit-normal timesteps: +1.0 dB co-visible, +1.0 dB return PSNR over uniform in the same 720 steps (RESULTS.md).
  c.recipe = ml_collections.ConfigDict(dict(
      chunk_size=2, timestep_distribution="logit_normal", timestep_shift=1.0, layout="diffusion_forcing",
      text_dropout=0.0,
      chunk_drop=dict(enabled=False, keep=5),
      head_windows=dict(enabled=False, window=12, global_fraction=0.25, pool=12)))
  # lr 2e-3 cosine to 0: +0.8 dB return PSNR, +0.06 SSIM over 1e-3 -> 1e-4 at 4,000 steps; 4e-3 is worse (RESULTS.md).
  # EMA 0.995: over a few hundred steps 0.999 would still hold half of the initial weights.
  c.optim = ml_collections.ConfigDict(dict(
      lr=2e-3, warmup_steps=50, end_lr_ratio=0.0, weight_decay=0.01, b1=0.9, b2=0.99, eps=1e-8, grad_clip=1.0,
      ema_decay=0.995))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  c.sharding_rules = [list(r) for r in DEFAULT_RULES]
  c.train = ml_collections.ConfigDict(dict(
      num_steps=900, log_every=10, ckpt_every=300, keep=3, async_checkpoint=True, sample_every=900,
      workdir="runs/tiny", distributed=False, init_from="", gain_every=300, task="diffusion"))
  # init_from: an earlier stage's workdir; gain_every: log the memory gain and the co-visible proxy every k steps
  # (0: off); task: what train.py runs (jaxwm.tasks: diffusion | distill)
  # 4 Euler steps: 0.2 dB below 10 at the return pose, 0.2-0.3 dB above on the frames in between (RESULTS.md).
  c.sample = ml_collections.ConfigDict(dict(num_steps=4, shift=3.0, guidance=1.0))
  return c
