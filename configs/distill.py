"""Few-step distillation of a trained model into a LoRA adapter (ReWorld §2.4; jaxwm.distill).

  python train.py --config configs/distill.py --config.distill.teacher=runs/tiny --workdir runs/tiny_distill
  python train.py --config configs/distill.py:small --config.distill.teacher=runs/small ...   # another teacher config
  python train.py --config configs/distill.py:viewrope_5b:smoke --config.distill.teacher=runs/viewrope_5b_smoke
  python sample.py --workdir runs/tiny --adapter runs/tiny_distill/adapter                   # 4 steps, merged

1-step students (RESULTS.md, 2026-12-05): ``--config.distill.student_steps=1 --config.distill.regression_weight=4
--config.distill.critic_updates=2 --config.distill.lr_generator=2e-4 --config.distill.rank=192 --config.distill.alpha=192
--config.distill.num_steps=100`` draws as much as the teacher where the first view is not in sight, with grain, and
scores 27.0 dB at the return frame (the teacher at 10 steps 29.5). Add ``--config.distill.noise_scale=0.1`` (the
student starts from a tenth of the noise) and it scores 29.2 without grain, but leaves what it has not seen flat grey.
The best 2-step student (28.6 dB; the teacher at 2 steps 25.8): ``--config.distill.student_steps=2
--config.distill.regression_weight=20 --config.distill.critic_updates=2 --config.distill.lr_generator=2e-4
--config.distill.rank=64 --config.distill.alpha=64 --config.distill.num_steps=25`` (with ``distill.exit=last``, the default since
the random exit was found to hold 2-step students under the teacher); 4 steps: 29.0 dB the same way. Later
iterations decline, so keep early adapters: ``--config.train.ckpt_every=25 --config.train.keep=20``. DMD2's GAN term
(``--config.distill.gan_weight``, off by default) reads whole training clips as its real samples; on the CPU teacher
its head stayed at chance over 130 iterations (RESULTS.md, 2026-12-05).

The config is the teacher's training config (``configs/<arg>.py``, default ``tiny``; ``<name>:<variant>`` for a
variant; the model must be the teacher's) plus a ``distill`` block. The run reads only first frames and camera paths
of the training clips (whole clips with the GAN term).
"""

import importlib

import ml_collections

from jaxwm.distill.loop import DistillConfig
from jaxwm.settings import defaults


def get_config(arg=None):
  name, _, variant = (arg or "tiny").partition(":")
  base = importlib.import_module(f"configs.{name}")
  c = base.get_config(variant) if variant else base.get_config()
  c.train.workdir = f"runs/{name}{'_' + variant if variant else ''}_distill"
  c.train.task = "distill"  # jaxwm.tasks: train.py runs jaxwm.distill.loop
  c.distill = ml_collections.ConfigDict(defaults(DistillConfig))  # jaxwm.distill.loop.DistillConfig documents each key
  c.distill.shift = c.sample.shift  # the student samples with the teacher's schedule shift
  return c
