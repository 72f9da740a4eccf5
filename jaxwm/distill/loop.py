"""The distillation run behind ``train.py --config configs/distill.py --config.distill.teacher=<workdir>``: a
few-step student LoRA ``G`` and a critic LoRA ``F`` over the frozen teacher (:mod:`jaxwm.distill.dmd`).

:class:`DistillTask` runs in training's step loop (:func:`jaxwm.training.runner.run_steps`: progress bar,
TensorBoard/JSONL scalars rewound on resume, a stop on a non-finite metric before it can reach a checkpoint) in a
locked workdir (:func:`jaxwm.training.workdir.run_locked`), with the mesh, parameter shardings, batches and data
loader of a :class:`jaxwm.training.loop.Trainer` of the same config, atomic checkpoints
(:class:`jaxwm.checkpoint.Checkpointer`) of ``{G, F, both optimizer states, step}`` with the data iterator and the
config, and exact resume (:mod:`jaxwm.training.resume`).

The teacher is restored params-only (:func:`jaxwm.sampling.load.restore_params`, its EMA when kept) from
``distill.teacher``; the step restored is recorded in the run's saved config (``distill.teacher_step``) and
a resume restores that same step. A teacher whose model differs from the config's is refused in one line.
At every checkpoint the student adapter is also saved on its own, ``<workdir>/adapter/<step>``
(:func:`jaxwm.lora.adapters.save_adapter`, with the few-step sampling settings in ``extra``), for
``sample.py --adapter <workdir>/adapter``.

Inputs are only first frames and camera trajectories (and text embeddings for text models) of the training
clips (:func:`jaxwm.training.data.make_loader`); no video target is used, except as the real samples of DMD2's
GAN term when ``distill.gan_weight > 0``.

Iteration ``s`` (from 0) updates the generator when ``s % distill.critic_updates == 0`` and the critic always
(:class:`Distiller`). ``metrics.jsonl`` / TensorBoard, every ``train.log_every`` iterations: the critic's
``critic_loss``, ``critic_grad_norm``, ``critic_norm`` (norm of F's ``b`` factors) of that iteration; the means
over the generator updates since the previous line of ``dmd_loss``, ``gen_grad_norm``, ``score_gap``
(``mean |v_fake - v_real|``: zero while the critic is still the teacher), ``dmd_norm`` and, with
``distill.regression_weight > 0``, ``regression_loss``, with ``gen_norm`` and ``generator_updates``;
``steps_per_s``. (A resume replays the same lines when ``train.ckpt_every`` is a multiple of
``train.log_every``.)
"""

import copy
import dataclasses
import math
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import flax.linen as nn

from jaxwm import checkpoint as ckpt_lib
from jaxwm import lora
from jaxwm.lora import adapters
from jaxwm import settings
from jaxwm.distill import dmd
from jaxwm.settings import Block, Bool, Choice, ConfigError, Float, Int, setting
from jaxwm.training import data as data_lib
from jaxwm.training import resume
from jaxwm.training.layout import teacher_forcing_layout
from jaxwm.training.loop import Trainer
from jaxwm.training.resume import resume_config_differences
from jaxwm.training.runner import Task, run_steps
from jaxwm.training.workdir import RunRefusedError, run_locked
from jaxwm.training.writers import say

ADAPTER_DIR = "adapter"
_TEACHER_KEYS = ("data.image_size", "data.latent_stride")  # with model.*: a teacher of another model is refused


# Jitted updates shared by every run of the same model, settings and mesh (as the streaming sampler's programs).
_PROGRAMS = {}


class DistillConfigError(RunRefusedError, ValueError):
  """A ``distill.*`` value is refused (one line: ``<key>=<value>: <allowed>``)."""


def _teacher(key, v):
  if not isinstance(v, str) or not v:
    raise ConfigError(key, v, "pass the teacher's training workdir: --config.distill.teacher=<workdir> (its newest "
                      "intact checkpoint is the frozen teacher)")
  if not pathlib.Path(v).expanduser().is_dir():
    raise ConfigError(key, v, "no such directory (the teacher's training workdir)")
  return v


@dataclasses.dataclass(frozen=True)
class DistillConfig(Block):
  """The ``distill`` block (``configs/distill.py``; a resume may change any key but ``rank`` and ``alpha``, which
  shape the adapters, and keeps the teacher step it started from).

  Attributes:
    teacher: the teacher's training workdir (required).
    teacher_step: its checkpoint step (-1: the newest intact one).
    use_ema: the teacher's EMA parameters when its checkpoint kept them.
    rank, alpha: LoRA of G (student) and F (critic); ReWorld: rank 128 on the 5B model.
    targets: the kernels that get factors (:data:`jaxwm.lora.TARGET_SETS`): ``blocks``, attention and FFN
      (ReWorld's); ``blocks_io`` adds the patch embedding, the time embedding and the head.
    student_steps, shift: the student's Euler schedule, ``flow.sampling_schedule(student_steps, shift)``.
    exit: where the generator's gradient leaves a chunk's rollout (:data:`jaxwm.distill.dmd.EXITS`); ``last`` (the
      default since 2026-12-04) beat ``random`` at 2 steps (28.5 dB at the return frame against 24.1) and at 4
      (29.0 against 28.4), RESULTS.md.
    guidance: the teacher's classifier-free guidance folded into the student (text models only; else 1).
    critic_updates: critic updates per generator update (DMD2's two time-scale rule: 5).
    lr_generator, lr_critic, b1, b2, grad_clip: Adam's (DMD2's ``b1 = 0``); ``grad_clip`` 0: none.
    t_min, t_max, timestep_shift: DMD and critic re-noising times ``shift(U(t_min, t_max))``.
    num_steps: iterations (every one updates the critic).
    regression_weight: ``lambda`` of the ODE-regression term of the generator's loss (0: pure DMD;
      :func:`jaxwm.distill.dmd.regression_loss`); its targets are the teacher's ``regression_steps``-step samples
      from the same noise and history (guidance 1 only).
    gan_weight: DMD2's GAN term in the generator's loss (:mod:`jaxwm.distill.gan`: a head on the critic's features
      tells the training clips from the student's rollouts); 0 (default): off. It shapes the state, so a resume
      keeps it.
    gan_critic_weight: the head's loss in the critic's (DMD2: 1e-2).
    lr_disc: Adam's learning rate of the head, which starts from scratch (the critic's factors keep ``lr_critic``).
    noise_scale: the student starts each chunk from ``noise_scale * N(0, I)`` (the teacher's regression targets
      from the unscaled noise); saved with the adapter, so ``sample.py --adapter`` and the loop-closure benchmark
      sample it that way. 1: the flow's prior. Below 1 a 1-step student leaves less grain and draws less where the
      first view is not in sight (0.1: +2.1 dB at the return frame, unseen views flat grey; RESULTS.md).
  """
  PREFIX = "distill"
  teacher: str = setting("", _teacher)
  teacher_step: int = setting(-1, Int(lo=-1, allowed="must be a checkpoint step >= 0, or -1 for the newest"),
                              resume="free")
  use_ema: bool = setting(True, Bool())
  rank: int = setting(16, Int(lo=1), resume="refused")
  targets: str = setting("blocks", Choice(tuple(lora.TARGET_SETS)), resume="refused")
  alpha: float = setting(16.0, Float(gt=0), resume="refused")
  student_steps: int = setting(4, Int(lo=1))
  shift: float = setting(3.0, Float(gt=0))
  exit: str = setting("last", Choice(dmd.EXITS))
  guidance: float = setting(1.0, Float(ge=1.0, allowed="must be a number >= 1 (1: no guidance)"))
  critic_updates: int = setting(5, Int(lo=1, allowed="must be an integer >= 1 (critic updates per generator "
                                                     "update; DMD2: 5)"))
  lr_generator: float = setting(1e-4, Float(gt=0))
  lr_critic: float = setting(1e-4, Float(gt=0))
  b1: float = setting(0.0, Float(ge=0, le=0.999999))
  b2: float = setting(0.999, Float(ge=0, le=0.999999))
  grad_clip: float = setting(10.0, Float(ge=0, allowed="must be >= 0 (0: no clipping)"))
  t_min: float = setting(0.02, Float(ge=0, le=1))
  t_max: float = setting(0.98, Float(gt=0, le=1, allowed="must be in (distill.t_min, 1]"))
  timestep_shift: float = setting(1.0, Float(gt=0))
  num_steps: int = setting(600, Int(lo=1))
  regression_weight: float = setting(0.0, Float(ge=0))
  regression_steps: int = setting(10, Int(lo=1))
  gan_weight: float = setting(0.0, Float(ge=0), resume="refused")
  gan_critic_weight: float = setting(0.01, Float(ge=0))
  lr_disc: float = setting(1e-3, Float(gt=0))
  noise_scale: float = setting(1.0, Float(gt=0))

  def check(self, prefix):
    if not self.t_min < self.t_max:
      raise ConfigError(f"{prefix}.t_max", self.t_max, f"must be in ({prefix}.t_min={self.t_min}, 1]")


def check_distill(config):
  """Checks the ``distill`` block (:class:`DistillConfig`) and that the model can be distilled as asked; raises
  :class:`DistillConfigError` (one line)."""
  try:
    if "distill" not in config:
      raise ConfigError("distill", "<missing>", "the config has no distill block (start from configs/distill.py)")
    d = DistillConfig.from_dict(config.distill)
    if d.regression_weight and d.guidance != 1.0:
      raise ConfigError("distill.regression_weight", d.regression_weight, "must be 0 with distill.guidance != 1 "
                        "(the regression targets are the unguided teacher's samples)")
    if d.guidance != 1.0 and not config.model.get("cross_attn", False):
      raise ConfigError("distill.guidance", d.guidance, "must be 1 for a model without text (model.cross_attn is "
                        "off: there is no condition for classifier-free guidance to drop)")
  except ConfigError as e:
    raise DistillConfigError(str(e)) from None


def settings_of(config):
  """The :class:`jaxwm.distill.dmd.DistillSettings` of a config."""
  d = config.distill
  return dmd.DistillSettings(student_steps=int(d.student_steps), shift=float(d.shift), guidance=float(d.guidance),
                             t_min=float(d.t_min), t_max=float(d.t_max), timestep_shift=float(d.timestep_shift),
                             exit=d.exit, latent_stride=int(config.data.latent_stride),
                             regression_weight=float(d.regression_weight),
                             regression_steps=int(d.regression_steps), gan_weight=float(d.gan_weight),
                             gan_critic_weight=float(d.gan_critic_weight), noise_scale=float(d.noise_scale))


def spec_of(config):
  """The :class:`jaxwm.lora.LoraSpec` of ``G`` and ``F`` (``distill.targets``; never the camera path)."""
  d = config.distill
  return lora.LoraSpec.of(d.targets, rank=int(d.rank), alpha=float(d.alpha))


class Distiller:
  """What a distillation run needs, built from a config: the :class:`Trainer` of the same config (model, mesh,
  shardings, batches, loader), the LoRA spec, optimizers, the state's shardings (``G``, ``F`` and their optimizer
  states sharded like the kernels they adapt, :func:`jaxwm.lora.factor_shardings`; the frozen base in the
  training parameter shardings) and the jitted updates, shared by every
  ``Distiller`` of the same model, settings and mesh (compiled once per process)."""

  def __init__(self, config, workdir, mesh=None):
    self.config = config
    self.trainer = tr = Trainer(config, workdir, mesh)
    self.model, self.mesh = tr.model, tr.mesh
    # Teacher and critic score the student's chunks against its clean frames (as streaming reads its cache), in the
    # teacher-forcing layout whatever recipe.layout trained the teacher.
    self.layout = teacher_forcing_layout(config.data.num_frames, config.recipe.chunk_size)
    self.spec, self.settings = spec_of(config), settings_of(config)
    d = config.distill
    self.tx_gen = dmd.make_optimizer(d.lr_generator, d.b1, d.b2, grad_clip=d.grad_clip)
    self.tx_critic = dmd.make_optimizer(d.lr_critic, d.b1, d.b2, grad_clip=d.grad_clip)
    self.tx_disc = dmd.make_optimizer(d.lr_disc, d.b1, d.b2, grad_clip=d.grad_clip)
    self.abstract_base = tr.abstract_state.params
    self.base_shardings = tr.state_shardings.params
    self.base_target = ckpt_lib.abstract_with_shardings(self.abstract_base, self.base_shardings)
    disc_dim = self.model.cfg.dim if self.settings.gan else None

    def init(key, base):
      return dmd.init_state(key, base, self.spec, self.tx_gen, self.tx_critic, disc_dim, self.tx_disc)

    self.abstract_state = jax.eval_shape(init, jax.random.key(0), self.abstract_base)
    # G, F and their optimizer states sharded like the kernels they adapt (FSDP), counters replicated.
    self.state_shardings = lora.factor_shardings(self.abstract_state, self.base_shardings,
                                                 NamedSharding(self.mesh, P()))
    self._init = jax.jit(init, in_shardings=(None, self.base_shardings), out_shardings=self.state_shardings)
    null_context = None
    if self.model.cfg.cross_attn and self.settings.guidance != 1.0:
      null_context = jnp.asarray(data_lib.make_source(config.data).null_text(), jnp.float32)
    self.step_fn = dmd.DistillStep(self.model, self.layout, self.spec, self.settings, self.tx_gen, self.tx_critic,
                                   null_context, self.tx_disc)
    batch_sh = tr.batch_shardings
    key = (self.model.cfg, int(config.data.num_frames), int(config.recipe.chunk_size), self.spec, self.settings,
           tuple(float(d[k]) for k in ("lr_generator", "lr_critic", "lr_disc", "b1", "b2", "grad_clip")),
           self.mesh, tr.rules,
           tuple(sorted((k, v.spec) for k, v in batch_sh.items())))
    if null_context is not None:  # the empty prompt's embedding is a constant of the program
      key += (id(null_context),)
    if key not in _PROGRAMS:
      _PROGRAMS[key] = self._compile(tr.rules, batch_sh)
    self._programs = _PROGRAMS[key]

  def generator_update(self, state, base, batch, key):
    """One generator update (jitted, on the mesh; donates ``state``): ``(state, metrics)``."""
    with jax.set_mesh(self.mesh):
      return self._programs[0](state, base, batch, key)

  def critic_update(self, state, base, batch, key):
    """One critic update, advancing ``state.step`` (jitted, on the mesh; donates ``state``): ``(state, metrics)``."""
    with jax.set_mesh(self.mesh):
      return self._programs[1](state, base, batch, key)

  def _compile(self, rules, batch_sh):
    """``(generator_update, critic_update)`` jitted on the mesh: ``(state, base, batch, key) -> (state, metrics)``
    with the keys of :class:`jaxwm.distill.dmd.DistillStep` (``fold_in(fold_in(key, step), 0 | 1)``); the critic
    update advances ``state.step``. Together, in that order, they are one ``DistillStep(..., train_generator=True)``."""
    fn = self.step_fn

    def gen(state, base, batch, key):
      with nn.logical_axis_rules(rules):
        return fn.generator_update(state, base, batch, jax.random.fold_in(jax.random.fold_in(key, state.step), 0))

    def critic(state, base, batch, key):
      with nn.logical_axis_rules(rules):
        state, metrics = fn.critic_update(state, base, batch,
                                          jax.random.fold_in(jax.random.fold_in(key, state.step), 1))
      return state.replace(step=state.step + 1), metrics

    jit = lambda f: jax.jit(f, in_shardings=(self.state_shardings, self.base_shardings, batch_sh, None),  # pylint: disable=unnecessary-lambda-assignment
                            out_shardings=(self.state_shardings, None), donate_argnums=(0,))
    return jit(gen), jit(critic)

  def init_state(self, base):
    with jax.set_mesh(self.mesh):
      return self._init(jax.random.key(self.config.seed), base)

  def put_batch(self, host):
    """A loader batch -> device arrays: the first frame of ``frames``/``latents`` (the whole clip with the GAN term,
    whose real samples it is), cameras, text embeddings."""
    if self.settings.gan:
      return self.trainer.put_batch(host)
    key = "latents" if "latents" in host else "frames"
    return self.trainer.put_batch({**host, key: np.asarray(host[key])[:, :1]})

  def iteration(self, state, base, batch, key, step):
    """Iteration ``step`` (``== state.step``): a generator update when ``step % distill.critic_updates == 0``,
    then a critic update. Returns ``(state, metrics, generator updated)``."""
    gen = step % int(self.config.distill.critic_updates) == 0
    metrics = {}
    if gen:
      state, metrics = self.generator_update(state, base, batch, key)
    state, m = self.critic_update(state, base, batch, key)
    return state, {**metrics, **m}, gen

  def restore_target(self):
    return ckpt_lib.abstract_with_shardings(self.abstract_state, self.state_shardings)


def load_teacher(config, target, step=None):
  """``(params, step)``: the teacher's parameters (EMA when kept and ``distill.use_ema``) restored alone into
  ``target``'s shardings; refuses (:class:`RunRefusedError`, one line) a missing/damaged teacher or one of
  another model."""
  from jaxwm.sampling.load import load_config, restore_params  # pylint: disable=g-import-not-at-top
  path = str(pathlib.Path(config.distill.teacher).expanduser())
  where = f"distill.teacher={config.distill.teacher!r}"
  try:
    step = None if step is None or step < 0 else int(step)
    saved = load_config(path, step)
    refused, _ = resume_config_differences(saved.to_dict(), config)
    refused = [r for r in refused if r[0].startswith("model.") or r[0] in _TEACHER_KEYS]
    if refused:
      diffs = "; ".join(f"{k}: {va!r} (teacher) != {vb!r}" for k, va, vb in refused)
      raise RunRefusedError(f"{where}: the teacher is another model: {diffs}. Distill with the teacher's config "
                            "(configs/distill.py:<its config>) or its values")
    params, src_step, field = restore_params(path, target, step, use_ema=config.distill.use_ema)
  except RunRefusedError:
    raise
  except (FileNotFoundError, ValueError) as e:
    raise RunRefusedError(f"{where}: {' '.join(str(e).split())}") from None
  say(f"teacher: {path} step {src_step} ({field})")
  return params, src_step


def _distill_differences(resolved):
  """``extra`` of :func:`jaxwm.training.resume.check_resume_config`: refuses another LoRA shape or teacher step, logs
  the other ``distill.*`` changes; fills ``resolved["teacher_step"]`` from the checkpoint's config."""

  def extra(saved, config):
    flat_saved = resume.flat(settings.absent_filled(DistillConfig, saved.get("distill", {})), "distill.")
    flat_now = resume.flat(config.distill.to_dict(), "distill.")
    rules = settings.resume_rules(DistillConfig)
    changed = [(k, flat_saved.get(k), flat_now.get(k)) for k in sorted(set(flat_saved) | set(flat_now))
               if flat_saved.get(k) != flat_now.get(k)]
    refused = [c for c in changed if rules.get(c[0]) == "refused"]
    logged = [c for c in changed if rules.get(c[0], "logged") == "logged"]
    teacher_step = flat_saved.get("distill.teacher_step", -1)
    if flat_now["distill.teacher_step"] not in (-1, teacher_step):
      refused.append(("distill.teacher_step", teacher_step, flat_now["distill.teacher_step"]))
    resolved["teacher_step"] = int(teacher_step)
    return refused, logged

  return extra


def _drop_adapters_after(directory, step):
  """Removes adapter steps newer than ``step`` (a resume replays them, bit for bit; Orbax refuses to save a step
  that exists)."""
  later = [s for s in ckpt_lib.step_dirs(directory) if s > step]
  if later and jax.process_index() == 0:
    for s in sorted(later):
      shutil.rmtree(ckpt_lib.step_dirs(directory)[s])
    say(f"removed adapter step(s) {sorted(later)} in {directory}: newer than the restored checkpoint (replayed)")


class DistillTask(Task):
  """DMD iterations of a :class:`Distiller` (``distill.num_steps`` of them); saves the adapter with each
  checkpoint."""

  name = "distill"

  def __init__(self, config, workdir, mesh=None):
    self.dist = dist = Distiller(config, workdir, mesh)
    d = config.distill
    self.config, self.workdir, self.num_steps = config, pathlib.Path(workdir), int(d.num_steps)
    self._key = jax.random.key(config.seed + 1)
    self.base = self.saved_config = self.extra = None
    n_lora = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(dist.abstract_state.generator))
    say(f"distilling: {n_lora / 1e6:.3f}M LoRA values per adapter (rank {d.rank}); {d.student_steps} student steps "
        f"(exit {d.exit}); guidance {d.guidance}; {d.critic_updates} critic updates per generator update; "
        + (f"ODE regression x{d.regression_weight} to the teacher at {d.regression_steps} steps; "
           if d.regression_weight else "")
        + (f"GAN term x{d.gan_weight} (critic x{d.gan_critic_weight}, head lr {d.lr_disc}); " if d.gan_weight else "")
        + "mesh "
        f"{dict(dist.mesh.shape)}; workdir {self.workdir}")

  def checkpointer(self):
    return self.dist.trainer.checkpointer()

  def make_loader(self):
    return self.dist.trainer.make_loader()

  def restore_or_init(self, ckpt, data_iter):
    dist, config, d = self.dist, self.config, self.config.distill
    resolved = {"teacher_step": int(d.teacher_step)}

    def init():
      self.base, resolved["teacher_step"] = load_teacher(config, dist.base_target, resolved["teacher_step"])
      return dist.init_state(self.base)

    def check(step):
      resume.check_resume_config(ckpt, step, config, extra=_distill_differences(resolved),
                                 require_saved="cannot tell which teacher step it distils",
                                 advice="distill in a new --workdir", what="other settings")

    state, start = resume.restore_or_init(ckpt, dist.restore_target(), data_iter, check=check, init=init)
    if self.base is None:  # resumed: the teacher step the run started from
      self.base, _ = load_teacher(config, dist.base_target, resolved["teacher_step"])
    self.saved_config = copy.deepcopy(config)
    self.saved_config.distill.teacher_step = resolved["teacher_step"]
    _drop_adapters_after(self.workdir / ADAPTER_DIR, start)
    self.extra = {**dist.settings.adapter_extra(), "teacher": str(d.teacher), "teacher_step": resolved["teacher_step"]}
    return state, start

  def step(self, state, host_batch, step):
    state, metrics, _ = self.dist.iteration(state, self.base, self.dist.put_batch(host_batch), self._key, step)
    return state, metrics

  def loss(self, metrics):
    return metrics["critic_loss"]

  def nonfinite_message(self, step, metrics, latest):
    bad = ", ".join(f"{k} {v}" for k, v in metrics.items() if not math.isfinite(v))
    return (f"non-finite distillation state at step {step} ({bad}): distillation stopped and this state was not "
            f"checkpointed (latest checkpoint: step {latest}); lower distill.lr_generator / distill.lr_critic")

  def summarise(self, window, rate):
    m = window[-1]
    scalars = {k: m[k] for k in ("critic_loss", "critic_grad_norm", "critic_norm", "disc_loss", "disc_real",
                                 "disc_fake", "disc_grad_norm") if k in m}
    gens = [w for w in window if "dmd_loss" in w]
    if gens:  # the generator updates since the last line (means)
      for k in ("dmd_loss", "gen_grad_norm", "score_gap", "dmd_norm", "regression_loss", "gan_loss"):
        if k in gens[0]:
          scalars[k] = float(np.mean([w[k] for w in gens]))
      scalars["gen_norm"] = gens[-1]["gen_norm"]
    scalars.update(generator_updates=len(gens), steps_per_s=rate)
    return scalars

  def postfix(self, scalars):
    out = {"critic": f"{scalars['critic_loss']:.4f}"}
    if scalars["generator_updates"]:
      out.update(dmd=f"{scalars['dmd_loss']:.2e}", gap=f"{scalars['score_gap']:.3f}")
      if "regression_loss" in scalars:
        out["reg"] = f"{scalars['regression_loss']:.4f}"
    if "disc_real" in scalars:  # the head's mean probability of "real" on real / student clips
      out["D"] = f"{scalars['disc_real']:.2f}/{scalars['disc_fake']:.2f}"
    return out

  def on_save(self, ckpt, done, state, data_iter):
    ckpt.save(done, state, data_iter, self.saved_config)
    adapters.save_adapter(self.workdir / ADAPTER_DIR, state.generator, self.dist.spec, self.base, step=done,
                      keep=self.config.train.keep, extra=self.extra)


def run(config, workdir, mesh=None, progress=True, hooks=()):
  """Distils (or resumes) until ``config.distill.num_steps`` iterations; returns ``(state, history)``.

  ``history``: the critic loss of every iteration of this call. Raises :class:`DistillConfigError` for a
  refused ``distill`` value before anything is created, :class:`jaxwm.training.workdir.WorkdirLockedError` for a
  workdir in use, :class:`RunRefusedError` for a missing teacher or a teacher of another model,
  :class:`jaxwm.training.resume.ResumeConfigError` for a resume with another model, LoRA rank/alpha or teacher
  step, :class:`jaxwm.training.runner.NonFiniteLossError` on a non-finite loss or gradient (that state is never
  checkpointed). A refused run in a workdir it created removes that workdir again.
  """
  check_distill(config)
  return run_locked(lambda c, w, m, p: run_steps(DistillTask(c, w, m), p, hooks), config, workdir, mesh, progress)
