"""The shape of Wan2.2-TI2V-5B (diffusers ``Wan-AI/Wan2.2-TI2V-5B-Diffusers`` transformer).

dim 3072 = 24 heads of 128, 30 layers, ffn 14336, 48 latent channels in and out, text 4096,
freq 256, patch (1, 2, 2). Built abstractly in the tests (``jax.eval_shape``), nothing allocated.
"""

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.model.update(dim=3072, num_heads=24, num_layers=30, ffn_dim=14336, in_channels=48, out_channels=48,
                 patch_size=(1, 2, 2), text_dim=4096, freq_dim=256, eps=1e-6, cross_attn=True, cross_attn_norm=True,
                 dtype="bfloat16", remat="full")
  c.model.camera.update(encoding="rope3d", channels="t_low", vae_stride=16)  # the released backbone; pick an encoding to fine-tune
  c.mesh.update(data=1, fsdp=-1)
  c.train.update(workdir="runs/wan22_ti2v_5b", num_steps=5000, ckpt_every=1000, sample_every=2000, gain_every=500)
  # The tiny CPU default's short-run choices (EMA 0.995, logit-normal timesteps, since 2026-12-02) are not this one's.
  c.optim.ema_decay = 0.999
  c.recipe.timestep_distribution = "uniform"
  c.recipe.layout = "teacher_forcing"
  return c
