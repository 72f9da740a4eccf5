"""The CPU-scale recipe (RESULTS.md, "The CPU recipe"): return frames that recall the first view.

  python train.py --config configs/recipe_cpu.py        # width 192, 40,000 steps: about 2 hours on a 2-core CPU
  python train.py --config configs/recipe_cpu.py:w384   # width 384, 12,000 steps: about 2 hours (estimated)

The tiny model and data layout, trained longer on four times the clips (1024 clips of 128 rooms), with
palindromic windows mixed in (every palindrome's way back revisits its way out: more copying to learn),
an EMA of the weights for sampling, and the memory gain logged every 1000 steps. Both resume where they stopped.

``w384`` doubles the width (8 heads of 48 channels, ffn 768): a token carries 192 values, and copying the first
view's token into the return frame while keeping the noisy input needs room for both in the residual stream; at
2,000 steps its memory gain already exceeds the width-192 default's at 5,000 (RESULTS.md). About 2.2x the time per step.
"""

from configs import tiny

VARIANTS = ("w192", "w384")


def get_config(variant="w192"):
  if variant not in VARIANTS:
    raise ValueError(f"configs/recipe_cpu.py:{variant}: not one of {VARIANTS}")
  c = tiny.get_config()
  c.data.update(num_clips=1024, palindrome_prob=0.25)
  if variant == "w192":  # as measured in RESULTS.md: the 2026-11-30 schedule and 10 Euler steps
    c.optim.update(lr=1e-3, warmup_steps=200, end_lr_ratio=0.1, ema_decay=0.999)
    c.sample.num_steps = 10
    c.train.update(num_steps=40000, ckpt_every=2500, keep=4, sample_every=5000, gain_every=1000,
                   workdir="runs/recipe_cpu")
  else:  # the default's schedule (lr 2e-3 cosine to 0, 4 Euler steps) at twice the width
    c.model.update(dim=384, num_heads=8, ffn_dim=768)
    c.optim.update(lr=2e-3, warmup_steps=200, end_lr_ratio=0.0, ema_decay=0.999)
    c.train.update(num_steps=12000, ckpt_every=2000, keep=6, sample_every=4000, gain_every=1000,
                   workdir="runs/recipe_cpu_w384")
  return c
