"""The training loop behind ``train.py``: mesh, sharded init or exact resume, jitted teacher-forcing
steps, progress bar, TensorBoard/JSONL scalars, periodic sample GIFs, atomic checkpoints,
and a stop on a non-finite loss before it can reach a checkpoint.
"""

import json
import logging
import math
import os
import pathlib
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxwm import checkpoint as ckpt_lib
from jaxwm.models.config import ModelConfig
from jaxwm.models.transformer import WanModel
from jaxwm.training import data as data_lib
from jaxwm.training import sharding as sh
from jaxwm.training.augment import routing_pool
from jaxwm.training.layout import make_layout
from jaxwm.training.optim import learning_rate_schedule, make_optimizer
from jaxwm.training.step import latent_shape, make_init_fn, make_loss_fn, make_train_step


class NonFiniteLossError(FloatingPointError):
  """Raised when a step's loss is NaN or inf; the state of that step is never checkpointed."""


class Trainer:
  """Everything a run needs, built from a config: model, mesh, shardings, jitted functions."""

  def __init__(self, config, workdir, mesh=None):
    self.config = config
    self.workdir = pathlib.Path(workdir)
    self.model_cfg = ModelConfig.from_dict(config.model)
    self.model = WanModel(self.model_cfg)
    self.mesh = mesh if mesh is not None else sh.make_mesh(config.mesh.data, config.mesh.fsdp)
    self.rules = sh.rules_from_config(config.sharding_rules)
    self.layout = make_layout(config.recipe.get("layout", "teacher_forcing"), config.data.num_frames,
                              config.recipe.chunk_size)
    num_steps = config.train.num_steps
    self.tx = make_optimizer(config.optim, num_steps)
    self.schedule = learning_rate_schedule(config.optim, num_steps)
    shape = latent_shape(config, len(self.layout.frame_pos))
    if self.model_cfg.camera_conditioned and self.model_cfg.camera.vae_stride != config.data.latent_stride:
      raise ValueError(f"model.camera.vae_stride={self.model_cfg.camera.vae_stride} must equal "
                       f"data.latent_stride={config.data.latent_stride}")
    hw = config.recipe.get("head_windows", {})
    routing = None
    if hw.get("enabled", False):
      routing = routing_pool(config.seed, self.model_cfg.num_heads, hw.get("pool", 12), hw.get("global_fraction", 0.25))
    init_fn = make_init_fn(self.model, self.tx, shape, config.optim.ema_decay, config.data.image_size, routing)
    with nn.logical_axis_rules(self.rules):
      abstract_boxed = jax.eval_shape(init_fn, jax.random.key(0))
      param_sh = sh.param_shardings(abstract_boxed.params, self.mesh, self.rules)
    self.abstract_state = nn.unbox(abstract_boxed)
    self.state_shardings = _state_shardings(self.abstract_state, param_sh, self.mesh)
    self._init = jax.jit(lambda key: nn.unbox(init_fn(key)), out_shardings=self.state_shardings)
    loss_fn = make_loss_fn(self.model, self.layout, config.recipe, config.data.latent_stride)
    step_fn = make_train_step(loss_fn, self.tx, self.schedule, config.optim.ema_decay)
    self.batch_shardings = {
        "frames": sh.batch_sharding(self.mesh, self.rules, 5),
        "c2w": sh.batch_sharding(self.mesh, self.rules, 4),
        "intrinsics": sh.batch_sharding(self.mesh, self.rules, 4),
    }

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
    return ckpt_lib.Checkpointer(self.workdir / "checkpoints", keep=self.config.train.keep,
                                 async_save=self.config.train.async_checkpoint)

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


def _say(msg):
  if jax.process_index() == 0:
    tqdm.write(msg)


def _maybe_initialize_distributed(config):
  if config.train.get("distributed", False) or "JAX_COORDINATOR_ADDRESS" in os.environ:
    jax.distributed.initialize()
    logging.info("jax.distributed initialised: process %d of %d", jax.process_index(), jax.process_count())


class _Writers:
  """Scalars to TensorBoard event files and a JSONL file (process 0 only)."""

  def __init__(self, workdir):
    self.active = jax.process_index() == 0
    if self.active:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self.tb = SummaryWriter(str(workdir / "tb"))
      self.jsonl = open(workdir / "metrics.jsonl", "a", encoding="utf-8")

  def write(self, step, scalars):
    if not self.active:
      return
    for k, v in scalars.items():
      self.tb.add_scalar(k, v, step)
    self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self.jsonl.flush()

  def close(self):
    if self.active:
      self.tb.close()
      self.jsonl.close()


def write_sample(trainer, params, step, path):
  """Streams eval clip 0 (a rotation loop) from its first frame; writes ground truth | generated as a GIF."""
  from jaxwm.sampling.clips import eval_clip, stream_clip  # pylint: disable=g-import-not-at-top
  from jaxwm.utils.media import side_by_side, write_video  # pylint: disable=g-import-not-at-top
  clip = eval_clip(trainer.config, 0)
  frames = stream_clip(trainer.model, {"params": params}, trainer.config, clip, key=jax.random.key(step))
  write_video(path, side_by_side(clip["frames"], frames), fps=4, scale=2)


def _init_from(trainer, state, path):
  """Starts from the parameters of another run (the previous stage of a progressive recipe, ViewRope §3.4):
  fresh optimizer state and step, parameters (EMA if kept) of ``path``'s latest checkpoint, restored alone
  (params-only, :func:`jaxwm.sampling.load.restore_params`) into this run's parameter shardings."""
  from jaxwm.sampling.load import restore_params  # pylint: disable=g-import-not-at-top
  target = ckpt_lib.abstract_with_shardings(trainer.abstract_state.params, trainer.state_shardings.params)
  try:
    params, src_step, _ = restore_params(path, target)
  except ValueError as e:
    raise ValueError(f"train.init_from={path!r}: {e} (a stage may change encodings, sparsity or data, "
                     "not the parameter set)") from None
  _say(f"initialised parameters from {path} (step {src_step})")
  ema = jax.tree_util.tree_map(jnp.copy, params) if state.ema else state.ema  # own buffers (donation)
  return state.replace(params=params, ema=ema)


def run(config, workdir, mesh=None, progress=True):
  """Trains (or resumes) until ``config.train.num_steps``; returns ``(state, history)``.

  ``history`` lists the per-step losses of this call. Raises :class:`NonFiniteLossError`
  on a NaN/inf loss, before any checkpoint of that state.
  """
  _maybe_initialize_distributed(config)
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  trainer = Trainer(config, workdir, mesh)
  tc = config.train
  n_params = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(trainer.abstract_state.params))
  _say(f"model: {n_params / 1e6:.2f}M parameters; mesh {dict(trainer.mesh.shape)}; "
       f"{trainer.tokens_per_step} tokens per step; workdir {workdir}")
  loader = trainer.make_loader()
  data_iter = iter(loader)
  ckpt = trainer.checkpointer()
  if ckpt.latest_step() is not None:
    state, start = ckpt.restore(trainer.restore_target(), data_iter)
    _say(f"resumed from step {start} in {ckpt.directory}")
  else:
    state, start = trainer.init_state(), 0
    if tc.get("init_from"):
      state = _init_from(trainer, state, tc.init_from)
  base_key = jax.random.key(config.seed + 1)
  writers = _Writers(workdir)
  history = []
  bar = tqdm(total=tc.num_steps, initial=start, disable=not progress or jax.process_index() != 0,
             desc="train", dynamic_ncols=True)
  t_last, steps_since = time.perf_counter(), 0
  try:
    for step in range(start, tc.num_steps):
      batch = trainer.put_batch(next(data_iter))
      with jax.set_mesh(trainer.mesh):
        state, metrics = trainer.train_step(state, batch, base_key)
      loss = float(metrics["loss"])
      norms = {k: float(metrics[k]) for k in ("grad_norm", "param_norm")}
      if not (math.isfinite(loss) and all(map(math.isfinite, norms.values()))):
        raise NonFiniteLossError(
            f"non-finite training state at step {step + 1} (loss {loss}, gradient norm {norms['grad_norm']}, "
            f"parameter norm {norms['param_norm']}): training stopped and this state was not checkpointed "
            f"(latest checkpoint: step {ckpt.latest_step()}); lower config.optim.lr or check the data")
      history.append(loss)
      steps_since += 1
      bar.update(1)
      done = step + 1
      if done % tc.log_every == 0 or done == tc.num_steps:
        dt = time.perf_counter() - t_last
        rate = steps_since / max(dt, 1e-9)
        scalars = {"loss": loss, **norms, "lr": float(metrics["lr"]),
                   "steps_per_s": rate, "tokens_per_s": rate * trainer.tokens_per_step}
        writers.write(done, scalars)
        bar.set_postfix(loss=f"{loss:.4f}", steps_s=f"{rate:.2f}", tok_s=f"{scalars['tokens_per_s']:.0f}")
        t_last, steps_since = time.perf_counter(), 0
      if done % tc.ckpt_every == 0 or done == tc.num_steps:
        ckpt.save(done, state, data_iter, config)
      if tc.sample_every and (done % tc.sample_every == 0 or done == tc.num_steps) and jax.process_index() == 0:
        write_sample(trainer, state.params, done, workdir / "samples" / f"step_{done:06d}.gif")
  finally:
    bar.close()
    writers.close()
    ckpt.close()
  return state, history
