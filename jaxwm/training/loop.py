"""Training (``train.task=diffusion``, the default task of ``train.py``): the :class:`Trainer` (model, mesh,
sharded init, jitted flow-matching steps in the recipe's layout) and :class:`TrainTask`, the steps
:func:`jaxwm.training.runner.run_steps` runs: exact resume (:mod:`jaxwm.training.resume`), ``train.init_from``
(an earlier stage, or the released Wan weights), atomic checkpoints, a stop on a non-finite loss before it can
reach a checkpoint. Probes and samples are hooks the caller passes (``train.py``: :mod:`jaxwm.evaluation.hooks`).
"""

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm import checkpoint as ckpt_lib
from jaxwm.models.config import ModelConfig
from jaxwm.models.transformer import WanModel
from jaxwm.training import data as data_lib
from jaxwm.training import resume
from jaxwm.training import sharding as sh
from jaxwm.training.augment import routing_pool
from jaxwm.training.layout import make_layout
from jaxwm.training.optim import learning_rate_schedule, make_optimizer
from jaxwm.training.recipe import recipe_of
from jaxwm.training.resume import ResumeConfigError, resume_config_differences
from jaxwm.training.runner import NonFiniteLossError, Task, run_steps
from jaxwm.training.step import latent_shape, make_init_fn, make_loss_fn, make_train_step
from jaxwm.training.workdir import RunRefusedError, WorkdirLockedError, maybe_initialize_distributed, run_locked
from jaxwm.training.writers import say

__all__ = ["NonFiniteLossError", "ResumeConfigError", "RunRefusedError", "TrainTask", "Trainer", "WorkdirLockedError",
           "maybe_initialize_distributed", "resume_config_differences", "run"]


class Trainer:
  """Everything a run needs, built from a config: model, mesh, shardings, jitted functions."""

  def __init__(self, config, workdir, mesh=None):
    self.config = config
    self.workdir = pathlib.Path(workdir)
    self.model_cfg = ModelConfig.from_dict(config.model)
    self.model = WanModel(self.model_cfg)
    self.mesh = mesh if mesh is not None else sh.make_mesh(config.mesh.data, config.mesh.fsdp)
    if not config.data.batch_size:  # 0: data.per_device_batch_size x the devices the batch is split over
      sh.resolve_batch_size(config, self.mesh.size, jax.process_count())
    self.rules = sh.rules_from_config(config.sharding_rules)
    self.recipe = recipe_of(config.recipe)
    self.layout = make_layout(self.recipe.layout, config.data.num_frames, self.recipe.chunk_size)
    num_steps = config.train.num_steps
    self.tx = make_optimizer(config.optim, num_steps)
    self.schedule = learning_rate_schedule(config.optim, num_steps)
    shape = latent_shape(config, len(self.layout.frame_pos))
    if self.model_cfg.camera_conditioned and self.model_cfg.camera.vae_stride != config.data.latent_stride:
      raise ValueError(f"model.camera.vae_stride={self.model_cfg.camera.vae_stride} must equal "
                       f"data.latent_stride={config.data.latent_stride}")
    hw = self.recipe.head_windows
    routing = None
    if hw.enabled:
      routing = routing_pool(config.seed, self.model_cfg.num_heads, hw.pool, hw.global_fraction)
    init_fn = make_init_fn(self.model, self.tx, shape, config.optim.ema_decay, config.data.image_size, routing)
    with nn.logical_axis_rules(self.rules):
      abstract_boxed = jax.eval_shape(init_fn, jax.random.key(0))
      param_sh = sh.param_shardings(abstract_boxed.params, self.mesh, self.rules)
    self.abstract_state = nn.unbox(abstract_boxed)
    self.state_shardings = _state_shardings(self.abstract_state, param_sh, self.mesh)
    self._init = jax.jit(lambda key: nn.unbox(init_fn(key)), out_shardings=self.state_shardings)
    records = config.data.source == "records"
    null_text = None
    if records and self.model_cfg.cross_attn:
      null_text = data_lib.make_source(config.data).null_text()
    loss_fn = make_loss_fn(self.model, self.layout, self.recipe, config.data.latent_stride, null_text)
    step_fn = make_train_step(loss_fn, self.tx, self.schedule, config.optim.ema_decay)
    self.batch_shardings = {
        "latents" if records else "frames": sh.batch_sharding(self.mesh, self.rules, 5),
        "c2w": sh.batch_sharding(self.mesh, self.rules, 4),
        "intrinsics": sh.batch_sharding(self.mesh, self.rules, 4),
    }
    if self.model_cfg.cross_attn:
      self.batch_shardings["text_emb"] = sh.batch_sharding(self.mesh, self.rules, 3)

    def sharded_step(state, batch, key):
      with nn.logical_axis_rules(self.rules):
        return step_fn(state, batch, key)

    self.train_step = jax.jit(sharded_step, in_shardings=(self.state_shardings, self.batch_shardings, None),
                              out_shardings=(self.state_shardings, None), donate_argnums=(0,))
    self.tokens_per_step = (config.data.batch_size * len(self.layout.frame_pos) *
                            (shape[2] // self.model_cfg.patch_size[1]) * (shape[3] // self.model_cfg.patch_size[2]))

  def init_state(self, seed=None):
    with jax.set_mesh(self.mesh):
      return self._init(jax.random.key(self.config.seed if seed is None else seed))

  def put_batch(self, batch):
    """Host batch (this process's rows) -> global arrays sharded over the mesh."""
    return {k: jax.make_array_from_process_local_data(self.batch_shardings[k], np.asarray(batch[k]))
            for k in self.batch_shardings}

  def make_loader(self, seed=None):
    per_process = self.config.data.batch_size // jax.process_count()
    return data_lib.make_loader(self.config.data, self.config.seed if seed is None else seed, per_process)

  def checkpointer(self):
    """The run's :class:`jaxwm.checkpoint.Checkpointer` (it sets damaged steps aside when resuming)."""
    return ckpt_lib.Checkpointer(self.workdir / "checkpoints", keep=self.config.train.keep,
                                 async_save=self.config.train.async_checkpoint, set_aside=True)

  def restore_target(self):
    return ckpt_lib.abstract_with_shardings(self.abstract_state, self.state_shardings)


def _state_shardings(abstract_state, param_sh, mesh):
  """Optimiser moments and EMA (subtrees shaped like the params) follow the params; the rest is replicated."""
  rep = sh.replicated(mesh)
  params_struct = jax.tree_util.tree_structure(abstract_state.params)
  is_params = lambda x: jax.tree_util.tree_structure(x) == params_struct  # pylint: disable=unnecessary-lambda-assignment
  opt = jax.tree_util.tree_map(lambda x: param_sh if is_params(x) else rep, abstract_state.opt_state,
                               is_leaf=is_params)
  return abstract_state.replace(step=rep, params=param_sh, opt_state=opt, ema=param_sh if abstract_state.ema else {},
                                routing={} if isinstance(abstract_state.routing, dict) else rep)


def _init_from(trainer, state, path):
  """Starts from the parameters of another run (the previous stage of a progressive recipe, ViewRope §3.4):
  fresh optimizer state and step, parameters (EMA if kept) of ``path``'s latest checkpoint, restored alone
  (params-only, :func:`jaxwm.sampling.load.restore_params`) into this run's parameter shardings."""
  from jaxwm.sampling.load import restore_params  # pylint: disable=g-import-not-at-top
  if _is_wan_weights(path):
    return _init_from_wan(trainer, state, path)
  target = ckpt_lib.abstract_with_shardings(trainer.abstract_state.params, trainer.state_shardings.params)
  try:
    params, src_step, _ = restore_params(path, target)
  except ValueError as e:
    raise RunRefusedError(f"train.init_from={path!r}: {e} (a stage may change encodings, sparsity or data, "
                     "not the parameter set)") from None
  except FileNotFoundError as e:  # none, or every step damaged
    raise RunRefusedError(f"train.init_from={path!r}: {' '.join(str(e).split())}") from None
  say(f"initialised parameters from {path} (step {src_step})")
  ema = jax.tree_util.tree_map(jnp.copy, params) if state.ema else state.ema  # own buffers (donation)
  return state.replace(params=params, ema=ema)


def _is_wan_weights(path):
  """A ``.safetensors`` file, or a directory of them without jaxwm checkpoints: released Wan weights."""
  p = pathlib.Path(path)
  return (p.is_file() and p.suffix == ".safetensors") or (p.is_dir() and any(p.glob("*.safetensors")) and not (
      p / "checkpoints").exists())


def _init_from_wan(trainer, state, path):
  """Fine-tuning's start: the released Wan transformer's weights for every backbone parameter (straight into
  this run's shardings), this model's own initialisation for what it adds (camera path, memory)."""
  from jaxwm.convert.wan import pretrained_params  # pylint: disable=g-import-not-at-top
  try:
    params, loaded, kept = pretrained_params(path, trainer.model_cfg, state.params)
  except (KeyError, ValueError, FileNotFoundError) as e:
    raise RunRefusedError(f"train.init_from={path!r}: {' '.join(str(e).split())}") from None
  say(f"initialised {len(loaded)} parameter arrays from the Wan weights at {path}; {len(kept)} added by this model "
       f"keep their initialisation" + (f" ({', '.join(kept[:4])}{', ...' if len(kept) > 4 else ''})" if kept else ""))
  ema = jax.tree_util.tree_map(jnp.copy, params) if state.ema else state.ema
  return state.replace(params=params, ema=ema)


class TrainTask(Task):
  """Flow-matching training steps of a :class:`Trainer` (``train.num_steps`` of them)."""

  name = "train"

  def __init__(self, config, workdir, mesh=None):
    self.trainer = Trainer(config, workdir, mesh)
    self.config, self.workdir, self.num_steps = config, pathlib.Path(workdir), int(config.train.num_steps)
    self._key = jax.random.key(config.seed + 1)
    tr = self.trainer
    n_params = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(tr.abstract_state.params))
    say(f"model: {n_params / 1e6:.2f}M parameters; mesh {dict(tr.mesh.shape)}; "
        f"{tr.tokens_per_step} tokens per step; workdir {self.workdir}")

  def checkpointer(self):
    return self.trainer.checkpointer()

  def make_loader(self):
    return self.trainer.make_loader()

  def restore_or_init(self, ckpt, data_iter):
    tr, config = self.trainer, self.config

    def init():
      state = tr.init_state()
      if config.train.get("init_from"):
        state = _init_from(tr, state, config.train.init_from)
      return state

    return resume.restore_or_init(ckpt, tr.restore_target(), data_iter, init=init,
                                  check=lambda step: resume.check_resume_config(ckpt, step, config))

  def step(self, state, host_batch, step):
    tr = self.trainer
    batch = tr.put_batch(host_batch)
    with jax.set_mesh(tr.mesh):
      state, m = tr.train_step(state, batch, self._key)
    return state, {k: m[k] for k in ("loss", "grad_norm", "param_norm", "lr")}

  def loss(self, metrics):
    return metrics["loss"]

  def nonfinite_message(self, step, metrics, latest):
    return (f"non-finite training state at step {step} (loss {metrics['loss']}, gradient norm "
            f"{metrics['grad_norm']}, parameter norm {metrics['param_norm']}): training stopped and this state was "
            f"not checkpointed (latest checkpoint: step {latest}); lower config.optim.lr or check the data")

  def summarise(self, window, rate):
    m = window[-1]
    return {**m, "steps_per_s": rate, "tokens_per_s": rate * self.trainer.tokens_per_step}

  def postfix(self, scalars):
    return {"loss": f"{scalars['loss']:.4f}", "steps_s": f"{scalars['steps_per_s']:.2f}",
            "tok_s": f"{scalars['tokens_per_s']:.0f}"}

  def on_save(self, ckpt, done, state, data_iter):
    ckpt.save(done, state, data_iter, self.config)


def run(config, workdir, mesh=None, progress=True, hooks=()):
  """Trains (or resumes) until ``config.train.num_steps``; returns ``(state, history)``.

  ``history`` lists the per-step losses of this call; ``hooks`` (:class:`jaxwm.training.runner.Hook`) add probes
  and samples: none by default (``jaxwm.tasks.run``, which ``train.py`` calls, passes the ones ``train.gain_every``
  and ``train.sample_every`` ask for: :func:`jaxwm.evaluation.hooks.training_hooks`). The workdir is locked for the call (:class:`jaxwm.training.workdir.WorkdirLock`, process 0): a
  workdir locked by a live process raises :class:`WorkdirLockedError` before anything in it is touched. Resuming
  restores the newest intact checkpoint; a checkpoint of another model raises :class:`ResumeConfigError`, a
  checkpoints directory with no intact step :class:`RunRefusedError` (both one line, before any Orbax read of the
  state). Raises :class:`NonFiniteLossError` on a NaN/inf loss, before any checkpoint of that state. A refused
  run in a workdir it created removes that workdir again.
  """
  return run_locked(lambda c, w, m, p: run_steps(TrainTask(c, w, m), p, hooks), config, workdir, mesh, progress)
