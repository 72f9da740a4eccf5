"""A small model (wider and deeper than tiny; same data) for benchmarks and longer CPU runs."""

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.model.update(dim=256, num_heads=4, num_layers=8, ffn_dim=1024, patch_size=(1, 2, 2))  # 16 tokens per frame
  c.optim.update(lr=1e-3, end_lr_ratio=0.1, ema_decay=0.999)  # deeper than tiny: tiny's schedule is not tested here
  c.train.update(num_steps=5000, ckpt_every=1000, sample_every=2000, gain_every=500)
  c.recipe.timestep_distribution = "uniform"
  c.model.camera.update(encoding="viewrope", channels="t_low")  # tiny's until 2026-12-02
  c.recipe.layout = "teacher_forcing"
  c.train.workdir = "runs/small"
  return c
