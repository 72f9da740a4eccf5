"""Few-step distillation of a trained model into a LoRA adapter (ReWorld §2.4; jaxwm.distill).

  python train.py --config configs/distill.py --config.distill.teacher=runs/tiny --workdir runs/tiny_distill
  python train.py --config configs/distill.py:small --config.distill.teacher=runs/small ...   # another teacher config
  python sample.py --workdir runs/tiny --adapter runs/tiny_distill/adapter                   # 4 steps, merged

The config is the teacher's training config (``configs/<arg>.py``, default ``tiny``; the model must be the
teacher's) plus a ``distill`` block. The run reads only first frames and camera paths of the training clips.
"""

import importlib

import ml_collections


def get_config(arg=None):
  base = importlib.import_module(f"configs.{arg or 'tiny'}")
  c = base.get_config()
  c.train.workdir = f"runs/{arg or 'tiny'}_distill"
  c.train.task = "distill"  # jaxwm.tasks: train.py runs jaxwm.distill.loop
  c.distill = ml_collections.ConfigDict(dict(
      teacher="",  # the teacher's training workdir (required)
      teacher_step=-1,  # its checkpoint step (-1: the newest intact one; a resume keeps the step it started from)
      use_ema=True,  # the teacher's EMA parameters when its checkpoint kept them
      rank=16, alpha=16.0,  # LoRA of G (student) and F (critic); ReWorld: rank 128 on the 5B model
      student_steps=4, shift=c.sample.shift,  # the student's Euler schedule: flow.sampling_schedule(4, shift)
      exit="random",  # gradient at a random step per chunk (Self Forcing), or "last"
      guidance=1.0,  # the teacher's classifier-free guidance, folded into the student (text models only; else 1)
      critic_updates=5,  # critic updates per generator update (DMD2's two time-scale rule)
      lr_generator=1e-4, lr_critic=1e-4, b1=0.0, b2=0.999, grad_clip=10.0,  # Adam, DMD2's b1 = 0
      t_min=0.02, t_max=0.98, timestep_shift=1.0,  # DMD / critic re-noising times shift(U(t_min, t_max))
      num_steps=600,  # iterations (every one updates the critic)
  ))
  return c
