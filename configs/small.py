"""A small model (wider and deeper than tiny; same data) for benchmarks and longer CPU runs."""

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.model.update(dim=256, num_heads=4, num_layers=8, ffn_dim=1024)
  c.optim.update(lr=1e-3, end_lr_ratio=0.1)  # deeper than tiny: tiny's faster schedule is not tested here
  c.train.workdir = "runs/small"
  return c
