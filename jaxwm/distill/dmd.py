"""Distribution-matching distillation (DMD) with self-forcing rollouts, confined to LoRA adapters
(ReWorld §2.4; Yin et al. 2024 "One-step diffusion with distribution matching distillation" (DMD),
Yin et al. 2024 "Improved DMD" (DMD2); Huang et al. 2025 "Self Forcing").

Three models share one frozen backbone ``W`` (the trained multi-step model):

- teacher ("real score"): ``W`` itself, with classifier-free guidance when the model has a text condition
  to drop: ``v_real = v_u + g (v_c - v_u)`` (``g = distill.guidance``; guidance is folded into the
  student, which is sampled at guidance 1);
- student ``G``: ``W + LoRA_G``, sampled with ``S`` Euler steps on the fixed schedule
  ``flow.sampling_schedule(S, shift)`` -- exactly :class:`jaxwm.sampling.streaming.StreamingSampler`'s
  sampler, so ``sample.py --adapter ... --steps S`` runs what was trained;
- critic ("fake score") ``F``: ``W + LoRA_F``, trained by flow matching on the student's samples.

The camera/pose path (Plücker injection, MRoPE/WorldRoPE parameters, LOCI memory), norms and modulation tables
carry no LoRA (:class:`jaxwm.lora.LoraSpec`'s exclusions), so distillation cannot change how the model reads
cameras; the embeddings and the head get factors only with ``distill.targets=blocks_io``.

Flow-matching algebra (``jaxwm.diffusion.flow``): ``x_t = (1 - t) x0 + t eps``, a velocity model
``v(x_t, t) ~ E[eps - x0 | x_t]`` gives

    x0_hat = x_t - t v,    eps_hat = x_t + (1 - t) v,    score s(x_t) = grad log p_t(x_t) = -eps_hat / t,

so ``s_fake - s_real = -(1 - t)/t (v_fake - v_real) = (1 - t)/t^2 (x0_fake - x0_real)`` and the
gradient of ``KL(p_fake,t || p_real,t)`` with respect to a generated sample ``x0`` (through
``dx_t/dx0 = 1 - t``) is ``(1 - t)(s_fake - s_real) = ((1 - t)/t)^2 (x0_fake - x0_real)``. DMD
(Yin et al. 2024 Eq. 7-8, as in the DMD2/Self-Forcing code) uses that direction in x0 space, with a
per-sample normaliser instead of the ``t``-dependent factor:

    grad = (x0_fake - x0_real) / mean |x0 - x0_real|          (t (v_real - v_fake) / mean |x0 - x0_real|)
    loss = 0.5 * mean((x0 - stop_gradient(x0 - grad))^2)      (d loss / d x0 = grad / numel)

(:func:`distribution_matching_grad`, :func:`dmd_loss`). The mean runs over one (row, chunk): each chunk
is re-noised at its own ``t``, as DMD normalises each sample at its own ``t``.

Scoring a streamed video: teacher and critic score the student's video in the teacher-forcing layout
the backbone was trained in (:mod:`jaxwm.training.layout`): the clean history is the student's own
frames (stop-gradient) and chunk ``c`` is re-noised at its ``t_c``, so every chunk's score is the
model's conditional score ``p(x_c | x_<c, cameras)``; by the chain rule
``KL(p_G(x_1..C) || p_T) = sum_c E KL(p_G(x_c | x_<c) || p_T(x_c | x_<c))`` and DMD matches each
conditional (the history is held fixed: no gradient through the context, as in Self Forcing's detached
KV cache).

Self-forcing rollout (:func:`student_rollout`): the student streams the video chunk by chunk from its own
KV cache exactly as at deployment (first frame committed, then per chunk ``S`` Euler steps against the
cache and one commit forward of the finished chunk), through :mod:`jaxwm.sampling.streaming`'s own
``denoise`` / ``chunk_forward`` / ``commit`` and :class:`jaxwm.models.cache.KVCache`. ``StreamingSampler``
itself is host-driven (jitted per chunk, numpy between chunks) and cannot return gradients, so the
rollout is one ``lax.scan`` over chunks of those same functions; it equals ``StreamingSampler.rollout``
bit for bit at equal weights (tests/test_dmd.py). Gradient flows through one denoising step per chunk
only: the steps before it and the cache (keys of committed chunks) are ``stop_gradient``
(Self Forcing §3.3's truncation). ``exit="last"`` takes the gradient at the last of the ``S`` steps;
``exit="random"`` (Self Forcing's stochastic truncation) draws per chunk a step ``k`` in ``0..S-1``,
and the chunk's output is the student's one-jump prediction ``x_k - t_k v`` at that step, so every step
of the few-step schedule is trained. Steps after ``k`` still run, with zero length (their time is held at
``t_k``), which keeps one compiled program for all ``k``. ``last`` is the default: with ``random`` the one-jump
outputs, which the sampler never produces, also become the next chunks' history, and on the default teacher
2- and 4-step students trained so scored 0.6-4.3 dB lower at the return frame (RESULTS.md, 2026-12-04;
measured with the ODE-regression term on).

ODE regression (optional, ``regression_weight = lambda > 0``): DMD matches distributions, so a 1-2 step
student may land on a sample the teacher would not have drawn from that noise. DMD (Yin et al. 2024) adds
a regression to paired teacher samples, and CausVid / Self Forcing initialise the student on such ODE
pairs. Here the pair is built inside the rollout: for each chunk the teacher integrates the chunk's own noise
with ``T`` Euler steps against the same cache (the student's history), and the generator's loss becomes

    dmd_loss + lambda * mean((x0_G - stop_gradient(x0_T))^2)          (:func:`regression_loss`)

GAN term (optional, ``gan_weight > 0``; DMD2 §4.3, :mod:`jaxwm.distill.gan`): a head on the critic's last hidden
state tells the training clips (re-noised, each chunk against its real history) from the student's rollouts; the
critic and head learn it, and the generator's loss adds ``gan_weight`` times the head's non-saturating loss on its
own re-noised chunks. Real data, not only the teacher, then shapes the student.

Updates alternate (DMD2's two time-scale rule): every ``critic_updates``-th iteration updates the
generator, every iteration updates the critic (:class:`DistillStep`).

Shapes: ``B`` rows, ``F = 1 + C * Sc`` latent frames (``C`` chunks of ``Sc``), latents ``[B, F, h, w, Ch]``;
``t`` per chunk ``[B, C]``, per noisy frame ``[B, F - 1]``.
"""

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwm import lora
from jaxwm.diffusion import flow
from jaxwm.distill import gan
from jaxwm.models import vae
from jaxwm.models.cache import KVCache
from jaxwm.models.conditioning import Cameras
from jaxwm.sampling import streaming

EXITS = ("random", "last")


@dataclasses.dataclass(frozen=True)
class DistillSettings:
  """The static settings of a distillation step (from the config's ``distill`` block).

  Attributes:
    student_steps: ``S``, Euler steps per chunk of the student.
    shift: the student's schedule shift (``flow.sampling_schedule(S, shift)``).
    guidance: the teacher's classifier-free guidance scale (1: plain teacher).
    t_min, t_max, timestep_shift: DMD / critic re-noising times: ``shift(U(t_min, t_max))`` per chunk.
    exit: ``random`` or ``last`` (see the module docstring).
    latent_stride: space-to-depth stride (batches of uint8 frames).
    regression_weight: ``lambda`` of the generator's ODE-regression term (:func:`regression_loss`); 0: pure DMD.
    regression_steps: ``T``, the teacher's Euler steps (schedule shift ``shift``) for the regression targets.
    gan_weight: DMD2's GAN term in the generator's loss (:mod:`jaxwm.distill.gan`); 0: no discriminator.
    gan_critic_weight: the discriminator's loss in the critic's (used when ``gan_weight > 0``).
    noise_scale: ``s``: the student streams each chunk from ``s z`` (``z ~ N(0, I)``, the teacher's regression
      target still from ``z``); the adapter records it and samplers use it (``sample.noise_scale``).
  """
  student_steps: int = 4
  shift: float = 3.0
  guidance: float = 1.0
  t_min: float = 0.02
  t_max: float = 0.98
  timestep_shift: float = 1.0
  exit: str = "last"
  latent_stride: int = 4
  regression_weight: float = 0.0
  regression_steps: int = 10
  gan_weight: float = 0.0
  gan_critic_weight: float = 0.01
  noise_scale: float = 1.0

  @property
  def gan(self):
    """Whether the GAN term (and its discriminator head) is on."""
    return self.gan_weight > 0

  def __post_init__(self):
    if self.exit not in EXITS:
      raise ValueError(f"distill.exit must be one of {EXITS}; got {self.exit!r}")
    if self.regression_weight and self.guidance != 1.0:
      raise ValueError(f"distill.regression_weight={self.regression_weight}: the regression targets are the "
                       "unguided teacher's samples; use it with distill.guidance=1")

  @property
  def regression_schedule(self):
    """``[T + 1]`` float32 times of the teacher's regression targets (``flow.sampling_schedule(T, shift)``)."""
    with jax.ensure_compile_time_eval():
      return np.asarray(flow.sampling_schedule(self.regression_steps, self.shift), np.float32)

  @property
  def schedule(self):
    """``[S + 1]`` float32 times from 1 to 0 (the student's Euler schedule, computed as the streaming sampler
    computes it: eagerly, in float32, even under a trace)."""
    with jax.ensure_compile_time_eval():
      return np.asarray(flow.sampling_schedule(self.student_steps, self.shift), np.float32)

  def adapter_extra(self):
    """What a distilled adapter records about how to sample it (``jaxwm.lora.adapters.save_adapter(extra=...)``)."""
    return {"num_steps": int(self.student_steps), "timesteps": [float(x) for x in self.schedule],
            "shift": float(self.shift), "guidance": 1.0, "distilled_guidance": float(self.guidance),
            "noise_scale": float(self.noise_scale)}


@flax.struct.dataclass
class DistillState:
  """``step`` (int32 scalar: iterations done), ``generator`` (LoRA G factors), ``critic`` (LoRA F factors),
  ``gen_opt`` / ``critic_opt``: their optimizer states; ``disc`` / ``disc_opt``: the GAN head
  (:func:`jaxwm.distill.gan.init_head`) and its optimizer state, None without the GAN term."""
  step: jax.Array
  generator: Any
  critic: Any
  gen_opt: Any
  critic_opt: Any
  disc: Any = None
  disc_opt: Any = None


# ---------------------------------------------------------------------------------------------------------------
# Distribution matching


def x0_from_velocity(x_t, v, t):
  """``x0_hat = x_t - t v`` (``t`` broadcast from the left)."""
  return x_t - _bcast(t, x_t) * v


def guided(v_c, v_u, guidance):
  """Classifier-free guidance ``v_u + g (v_c - v_u)``."""
  return v_u + guidance * (v_c - v_u)


def distribution_matching_grad(x0, x_t, v_real, v_fake, t, axes=None):
  """DMD's gradient of ``KL(p_fake || p_real)`` with respect to generated samples ``x0`` (module docstring).

  Args:
    x0: generated samples ``[..., D...]`` (treated as constants here).
    x_t: ``(1 - t) x0 + t eps``, the re-noised samples the scores were taken at.
    v_real, v_fake: velocities of the teacher (guided) and of the critic at ``x_t``.
    t: times broadcastable from the left (``[B, S]`` against ``[B, S, h, w, C]``), in ``(0, 1)``.
    axes: the axes of one normalisation group (default: all but the first: one per sample).

  Returns:
    ``(grad, norm)``: ``grad = (x0_fake - x0_real) / norm`` with ``x0_* = x_t - t v_*`` and
    ``norm = mean_axes |x0 - x0_real|`` (keepdims); non-finite entries of ``grad`` become 0 (as DMD2).
  """
  x0 = jax.lax.stop_gradient(x0)
  axes = tuple(range(1, x0.ndim)) if axes is None else axes
  x0_real = x0_from_velocity(x_t, v_real, t)
  x0_fake = x0_from_velocity(x_t, v_fake, t)
  norm = jnp.mean(jnp.abs(x0 - x0_real), axis=axes, keepdims=True)
  grad = (x0_fake - x0_real) / jnp.maximum(norm, 1e-12)
  return jax.lax.stop_gradient(jnp.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)), norm


def dmd_loss(x0, grad):
  """``0.5 * mean((x0 - stop_gradient(x0 - grad))^2)``: its gradient with respect to ``x0`` is ``grad / x0.size``
  (its value, ``0.5 mean(grad^2)``, only monitors the size of the step)."""
  target = jax.lax.stop_gradient(x0 - grad)
  return 0.5 * jnp.mean(jnp.square(x0 - target))


def regression_loss(x0, target):
  """The ODE-regression term ``mean((x0 - stop_gradient(target))^2)``: the student's sample against the teacher's
  multi-step sample from the same noise and history (the regression loss of DMD, Yin et al. 2024, which uses
  LPIPS there; CausVid and Self Forcing's ODE initialisation). It pulls each sample to its own teacher sample,
  where DMD only matches distributions; at a low step count it trades sharpness for fidelity to the teacher's
  trajectory."""
  return jnp.mean(jnp.square(x0 - jax.lax.stop_gradient(target)))


def flow_matching_loss(v, x0, eps):
  """The critic's loss ``mean((v - (eps - x0))^2)`` on re-noised student samples."""
  return jnp.mean(jnp.square(v - flow.velocity_target(x0, eps)))


def sample_times(key, shape, t_min, t_max, shift=1.0):
  """Re-noising times ``shift(U(t_min, t_max))`` (``flow.shift_timesteps``)."""
  return flow.shift_timesteps(jax.random.uniform(key, shape, minval=t_min, maxval=t_max), shift)


def _bcast(t, x):
  t = jnp.asarray(t)
  return t.reshape(t.shape + (1,) * (x.ndim - t.ndim))


def chunk_groups(x, chunk_size):
  """``[B, C * Sc, ...] -> [B, C, Sc, ...]``: the noisy frames of the layout grouped by chunk."""
  b, n = x.shape[:2]
  return x.reshape(b, n // chunk_size, chunk_size, *x.shape[2:])


# ---------------------------------------------------------------------------------------------------------------
# Scoring a video in the teacher-forcing layout


def score_velocity(model, params, video, x_t, t, cameras, layout, context=None, rng=None, features=False):
  """Velocity of re-noised frames, each chunk against the clean frames before it (the training layout).

  Args:
    model: the :class:`jaxwm.models.transformer.WanModel`; params: its parameters.
    video: ``[B, F, h, w, C]`` clean frames (the clean half of the sequence: frames of chunks ``0..C-2``).
    x_t: ``[B, F - 1, h, w, C]`` the noisy frames (chunks ``1..C-1``) at times ``t``.
    t: ``[B, F - 1]`` per noisy frame (constant within a chunk).
    cameras: :class:`Cameras` ``[B, F]`` of the clip's frames.
    layout: the teacher-forcing :class:`jaxwm.training.layout.TeacherForcingLayout` of ``F`` frames.
    context: ``[B, Lt, D]`` text (``model.cross_attn``).
    rng: the ``frame_select`` stream (frame-sparse models).
    features: also return the last hidden state of the noisy frames' tokens (:mod:`jaxwm.distill.gan`).

  Returns:
    ``[B, F - 1, h, w, C]`` float32 velocities of the noisy frames; with ``features`` also ``[B, L_noisy, D]``.
  """
  b = video.shape[0]
  n_clean = layout.num_clean
  seq = jnp.concatenate([video[:, jnp.asarray(layout.clean_frames)], x_t.astype(video.dtype)], axis=1)
  ts = jnp.concatenate([jnp.zeros((b, n_clean)), t * flow.TIMESTEP_SCALE], axis=1)
  cams = None if cameras is None else cameras.frames(jnp.asarray(layout.frame_pos.astype(np.int32)))
  rngs = None if rng is None else {"frame_select": rng}
  if not features:
    v, _ = model.apply({"params": params}, seq, ts, layout.frames(b, cams), context=context, rngs=rngs)
    return v[:, n_clean:]
  (v, _), cols = model.apply({"params": params}, seq, ts, layout.frames(b, cams), context=context, rngs=rngs,
                             mutable=[gan.FEATURES])
  hidden = cols[gan.FEATURES]["hidden"][0]
  return v[:, n_clean:], hidden[:, hidden.shape[1] * n_clean // seq.shape[1]:]


def teacher_velocity(model, params, video, x_t, t, cameras, layout, context=None, null_context=None, guidance=1.0,
                     rng=None):
  """:func:`score_velocity` of the teacher with classifier-free guidance: with ``guidance != 1`` the
  conditional (``context``) and unconditional (``null_context [B or 1, Lt, D]``) branches run as one doubled
  batch and ``v_u + g (v_c - v_u)`` is returned."""
  if guidance == 1.0:
    return score_velocity(model, params, video, x_t, t, cameras, layout, context, rng)
  if context is None or null_context is None:
    raise ValueError("teacher guidance != 1 needs a text context and the empty prompt's embedding")
  two = lambda a: jnp.concatenate([a, a])  # pylint: disable=unnecessary-lambda-assignment
  null = jnp.broadcast_to(jnp.asarray(null_context, context.dtype), context.shape)
  cams = None if cameras is None else Cameras(two(cameras.c2w), two(cameras.intrinsics))
  v = score_velocity(model, params, two(video), two(x_t), two(t), cams, layout, jnp.concatenate([context, null]), rng)
  v_c, v_u = jnp.split(v, 2)
  return guided(v_c, v_u, guidance)


# ---------------------------------------------------------------------------------------------------------------
# Self-forcing rollout


def student_rollout(model, params, first, cameras, key, schedule, chunk_size, num_frames, context=None,
                    exit_steps=None, teacher=None, teacher_schedule=None, noise_scale=1.0):
  """Streams ``num_frames`` frames from ``first`` chunk by chunk from the student's own KV cache.

  The same computation as ``StreamingSampler(model, {"params": params}, num_steps=S, ...).rollout(first,
  num_frames, chunk_size, key, cameras)`` with full memory (noise of chunk ``c``: ``noise_scale *
  normal(fold_in(key, c + 1))``, the sampler's ``noise_scale``; frame-sparse streams as there), written as a
  ``lax.scan`` over chunks so that it can be
  differentiated: the gradient with respect to ``params`` flows through one denoising step per chunk
  (``exit_steps``); the earlier steps and the cache are computed with ``stop_gradient(params)``.

  Args:
    model: the :class:`WanModel`; params: the student's parameters (e.g. ``apply_lora(base, G, spec)``).
    first: ``[B, 1, h, w, C]`` latents of the conditioning frame.
    cameras: :class:`Cameras` ``[B, F]`` of the whole trajectory (re-anchored on frame 0), or None.
    key: noise key.
    schedule: ``[S + 1]`` times from 1 to 0 (``flow.sampling_schedule(S, shift)``).
    chunk_size, num_frames: ``F = 1 + C * chunk_size``.
    context: ``[B, Lt, D]`` text (``model.cross_attn``), the student's condition (guidance 1).
    exit_steps: ``[C]`` int, the step ``k`` in ``0..S-1`` whose one-jump prediction ``x_k - t_k v`` is
      chunk ``c``'s output (the steps after it have zero length); None: ``S - 1`` (the full sampler).
    teacher, teacher_schedule: the teacher's parameters and its Euler schedule ``[T + 1]``: each chunk's
      regression target (:func:`regression_loss`) is the teacher's ``T``-step sample from the chunk's own noise
      against the same cache (the student's history): the ODE pair of CausVid / Self Forcing's initialisation.
      The teacher starts from the unscaled noise ``z``, the student from ``noise_scale * z``.
    noise_scale: the scale of the student's starting noise.

  Returns:
    ``[B, F, h, w, C]`` float32: ``first`` then the generated chunks; with ``teacher`` also the targets
    ``[B, F - 1, h, w, C]`` (stop-gradient) of the generated frames.
  """
  if (num_frames - 1) % chunk_size or num_frames <= 1:
    raise ValueError(f"num_frames={num_frames} must be 1 + k * chunk_size (chunk_size={chunk_size}, k >= 1)")
  cfg = model.cfg
  b, _, h, w, ch = first.shape
  n_chunks = (num_frames - 1) // chunk_size
  schedule = jnp.asarray(schedule, jnp.float32)
  if teacher is not None:
    teacher = jax.lax.stop_gradient(teacher)
    teacher_schedule = jnp.asarray(teacher_schedule, jnp.float32)
  steps = schedule.shape[0] - 1
  sparse = cfg.attention.sparse
  ph, pw = cfg.patch_size[1:]
  frozen = {"params": jax.lax.stop_gradient(params)}
  live = {"params": params}
  cameras = Cameras.of(cameras)
  if cameras is None and cfg.camera_conditioned:
    raise ValueError("this model is camera-conditioned: pass the trajectory's cameras")
  cache = KVCache.empty(cfg, b, num_frames, (h // ph) * (w // pw), cfg.compute_dtype)
  pos0 = jnp.broadcast_to(jnp.arange(1, dtype=jnp.float32), (b, 1))
  cache = streaming.commit(model, frozen, cache, first, pos0, context,
                           None if cameras is None else cameras.frames(slice(0, 1)),
                           jax.random.key(0) if sparse else None)
  per_chunk = None
  if cameras is not None:
    group = lambda a: jnp.swapaxes(a[:, 1:].reshape(b, n_chunks, chunk_size, *a.shape[2:]), 0, 1)  # pylint: disable=unnecessary-lambda-assignment
    per_chunk = Cameras(group(cameras.c2w), group(cameras.intrinsics))
  exits = (jnp.full((n_chunks,), steps - 1, jnp.int32) if exit_steps is None
           else jnp.asarray(exit_steps, jnp.int32))
  idx = jnp.arange(steps)

  def body(cache, xs):
    c, cams, k = xs
    ck = jax.random.fold_in(key, c + 1)
    z = jax.random.normal(ck, (b, chunk_size, h, w, ch))
    start = (1 + c * chunk_size).astype(jnp.float32)
    pos = jnp.broadcast_to(start + jnp.arange(chunk_size, dtype=jnp.float32), (b, chunk_size))
    rng = jax.random.fold_in(ck, 1) if sparse else None
    views = streaming.cache_views(model, cache, cams)  # once per chunk (the cache and cameras are fixed)
    # Steps 0..k-1 without gradient; after k they have zero length (time held at t_k).
    held = jnp.where(idx <= k, schedule[:steps], schedule[k])
    x = streaming.denoise(model, frozen, cache, z * noise_scale, pos, held, context, 1.0, cams, rng, views=views)
    x = jax.lax.stop_gradient(x)
    t = schedule[k]
    v, _ = streaming.chunk_forward(model, live, streaming.with_views(cache, views), x, jnp.full((b, chunk_size), t),
                                   pos, context, cams, None if rng is None else jax.random.fold_in(rng, k))
    x0 = flow.euler_step(x, v, t, schedule[steps])
    target = () if teacher is None else jax.lax.stop_gradient(
        streaming.denoise(model, {"params": teacher}, cache, z, pos, teacher_schedule, context, 1.0, cams, rng,
                          views=views))
    cache = streaming.commit(model, frozen, cache, jax.lax.stop_gradient(x0), pos, context, cams,
                             jax.random.fold_in(ck, 2) if sparse else None, views=views)
    return cache, (x0, target)

  _, (chunks, targets) = jax.lax.scan(body, cache, (jnp.arange(n_chunks), per_chunk, exits))
  def flat(a):  # [C, B, Sc, ...] -> [B, C * Sc, ...]
    return jnp.swapaxes(a, 0, 1).reshape(b, n_chunks * chunk_size, h, w, ch)

  video = jnp.concatenate([first.astype(chunks.dtype), flat(chunks)], axis=1)
  return video if teacher is None else (video, flat(targets))


# ---------------------------------------------------------------------------------------------------------------
# Steps


def clip_latents(batch, latent_stride, frames=1):
  """``[B, frames, h, w, C]`` latents of the clip's first ``frames`` frames: ``batch["latents"]`` (ingested
  records) or the space-to-depth encoding of ``batch["frames"]`` (uint8). Frame 0 conditions the student; whole
  clips are the GAN term's real samples."""
  x = batch["latents"] if "latents" in batch else batch["frames"]
  if x.shape[1] < frames:
    raise ValueError(f"the batch has {x.shape[1]} frames; {frames} are read (the GAN term reads whole clips)")
  x = x[:, :frames]
  return x.astype(jnp.float32) if "latents" in batch else vae.encode(x, latent_stride)


def first_latents(batch, latent_stride):
  """``[B, 1, h, w, C]`` latents of the conditioning frame (:func:`clip_latents`)."""
  return clip_latents(batch, latent_stride)


def make_optimizer(lr, b1=0.0, b2=0.999, eps=1e-8, grad_clip=0.0):
  """Adam (DMD2: ``b1 = 0``) at a constant ``lr`` after global-norm clipping (``grad_clip > 0``)."""
  return optax.chain(optax.clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity(),
                     optax.adam(lr, b1=b1, b2=b2, eps=eps))


def init_state(key, base, spec, tx_gen, tx_critic, disc_dim=None, tx_disc=None):
  """A fresh :class:`DistillState`: ``G`` and ``F`` from :func:`jaxwm.lora.init_lora` (``B = 0``: the student and
  the critic start as the teacher, bit for bit), their optimizer states, step 0; with ``disc_dim`` (the model's
  width) also the GAN head and its optimizer state (``tx_disc``'s; default ``tx_critic``'s)."""
  g = lora.init_lora(jax.random.fold_in(key, 1), base, spec)
  f = lora.init_lora(jax.random.fold_in(key, 2), base, spec)
  disc = None if disc_dim is None else gan.init_head(jax.random.fold_in(key, 3), disc_dim)
  return DistillState(step=jnp.zeros((), jnp.int32), generator=g, critic=f, gen_opt=tx_gen.init(g),
                      critic_opt=tx_critic.init(f), disc=disc,
                      disc_opt=None if disc is None else (tx_disc or tx_critic).init(disc))


class DistillStep:
  """One iteration of distillation: ``step(state, base, batch, key, train_generator) -> (state, metrics)``.

  With ``train_generator`` (a Python bool: two compiled programs) the generator ``G`` takes one step on the
  DMD loss (:meth:`generator_update`); then the critic ``F`` takes one step on the flow-matching loss of a fresh
  student rollout (:meth:`critic_update`); ``state.step`` advances by one. Both roll out the student
  (:func:`student_rollout`) from ``batch``'s first frames and cameras; ``base`` (the teacher's parameters) is
  never differentiated (``stop_gradient``) nor returned.

  Args:
    model, layout: the backbone and the teacher-forcing layout of the clip (``F`` frames).
    spec: the :class:`jaxwm.lora.LoraSpec` of ``G`` and ``F``.
    settings: :class:`DistillSettings`.
    tx_gen, tx_critic: optax transformations of ``G``'s and ``F``'s factor trees.
    null_context: ``[Lt, D]`` the empty prompt's embedding (teacher guidance != 1).
    tx_disc: the GAN head's optax transformation (default ``tx_critic``).

  ``batch``: ``frames`` uint8 ``[B, >=1, H, W, 3]`` or ``latents`` ``[B, >=1, h, w, C]`` (only frame 0 is used, but
  for the GAN term's real samples, whole clips),
  ``c2w [B, F, 4, 4]``, ``intrinsics [B, F, 3, 3]``; with ``model.cross_attn`` ``text_emb [B, Lt, D]``.
  Keys: ``fold_in(key, state.step)``, then 0 (generator) and 1 (critic).

  Metrics: ``critic_loss``, ``critic_grad_norm``, ``critic_norm``; with ``train_generator`` also ``dmd_loss``,
  ``gen_grad_norm``, ``gen_norm``, ``score_gap`` (``mean |v_fake - v_real|``), ``dmd_norm`` (the mean
  normaliser ``mean |x0 - x0_real|``) and, with ``settings.regression_weight``, ``regression_loss``; with the GAN
  term (``settings.gan``; ``batch`` then holds whole clips) ``gan_loss``, ``disc_loss``, ``disc_real``,
  ``disc_fake``, ``disc_grad_norm``. ``critic_loss`` is the flow-matching term alone. Norms of ``G`` / ``F`` are of
  their ``b`` factors (zero at init).
  """

  def __init__(self, model, layout, spec, settings, tx_gen, tx_critic, null_context=None, tx_disc=None):
    if settings.guidance != 1.0 and not model.cfg.cross_attn:
      raise ValueError(f"distill.guidance={settings.guidance}: classifier-free guidance needs a text-conditioned "
                       "model (model.cross_attn); a camera-only model has no condition to drop (use 1)")
    if settings.guidance != 1.0 and null_context is None:
      raise ValueError("distill.guidance != 1 needs the empty prompt's embedding (null_context)")
    self.model, self.layout, self.spec, self.settings = model, layout, spec, settings
    self.tx_gen, self.tx_critic, self.null_context = tx_gen, tx_critic, null_context
    self.tx_disc = tx_disc or tx_critic
    self.num_frames = len(layout.chunk) - layout.num_clean + 1
    self.chunk_size = int(np.sum(layout.chunk[layout.num_clean:] == 1))
    self.n_chunks = (self.num_frames - 1) // self.chunk_size
    self.noisy_chunk = np.asarray(layout.chunk[layout.num_clean:] - 1)

  def _inputs(self, batch):
    first = first_latents(batch, self.settings.latent_stride)
    cams = Cameras(batch["c2w"].astype(jnp.float32), batch["intrinsics"].astype(jnp.float32))
    context = batch["text_emb"].astype(jnp.float32) if self.model.cfg.cross_attn else None
    return first, cams, context

  def rollout(self, params, batch, key, teacher=None):
    """The student's self-forcing rollout ``[B, F, h, w, C]`` (exit steps drawn from ``key`` when ``exit="random"``);
    with ``teacher`` (its parameters) also the regression targets (:func:`student_rollout`)."""
    first, cams, context = self._inputs(batch)
    k_noise, k_exit = jax.random.split(key)
    s = self.settings
    exits = jax.random.randint(k_exit, (self.n_chunks,), 0, s.student_steps) if s.exit == "random" else None
    return student_rollout(self.model, params, first, cams, k_noise, s.schedule, self.chunk_size, self.num_frames,
                           context, exits, teacher, None if teacher is None else s.regression_schedule,
                           s.noise_scale)

  def real_video(self, batch):
    """``[B, F, h, w, C]`` latents of the training clip itself (the GAN term's real samples)."""
    return clip_latents(batch, self.settings.latent_stride, self.num_frames)

  def _renoise(self, video, key):
    """``(t [B, F-1], eps, x_t)``: one time per chunk of the generated frames, shared by its frames."""
    s = self.settings
    k_t, k_eps = jax.random.split(key)
    t = sample_times(k_t, (video.shape[0], self.n_chunks), s.t_min, s.t_max, s.timestep_shift)
    t = t[:, jnp.asarray(self.noisy_chunk)]
    x0 = video[:, 1:]
    eps = jax.random.normal(k_eps, x0.shape, x0.dtype)
    return t, eps, flow.noise(x0, eps, t)

  def generator_loss(self, g, f, base, batch, key, disc=None):
    """``(dmd_loss + regression_weight * regression_loss + gan_weight * gan_loss, aux)`` of the student ``base + G``
    (differentiable in ``g`` through one step per chunk); ``aux``: ``dmd_loss``, ``score_gap``, ``dmd_norm`` and,
    with a regression term, ``regression_loss``; with the GAN term (head ``disc``) ``gan_loss``."""
    sg = jax.lax.stop_gradient
    k_roll, k_t, k_sel = jax.random.split(key, 3)
    frozen = sg(base)
    lam = self.settings.regression_weight
    video = self.rollout(lora.apply_lora(frozen, g, self.spec), batch, k_roll, frozen if lam else None)
    if lam:
      video, targets = video
    clean = sg(video)
    t, eps, x_t = self._renoise(clean, k_t)
    _, cams, context = self._inputs(batch)
    v_real = teacher_velocity(self.model, frozen, clean, x_t, t, cams, self.layout, context, self.null_context,
                              self.settings.guidance, k_sel)
    fake = lora.apply_lora(frozen, sg(f), self.spec)
    if self.settings.gan:  # the same x_t, differentiable in G; F's forward also gives the head its features
      v_fake, feats = score_velocity(self.model, fake, clean, flow.noise(video[:, 1:], eps, t), t, cams, self.layout,
                                     context, k_sel, features=True)
      v_fake = sg(v_fake)
    else:
      v_fake = score_velocity(self.model, fake, clean, x_t, t, cams, self.layout, context, k_sel)
    grouped = lambda a: chunk_groups(a, self.chunk_size)  # pylint: disable=unnecessary-lambda-assignment
    grad, norm = distribution_matching_grad(grouped(clean[:, 1:]), grouped(x_t), grouped(v_real), grouped(v_fake),
                                            grouped(t), axes=(2, 3, 4, 5))
    loss = dmd_loss(grouped(video[:, 1:]), grad)
    aux = {"dmd_loss": loss, "score_gap": jnp.mean(jnp.abs(v_fake - v_real)), "dmd_norm": jnp.mean(norm)}
    if lam:
      aux["regression_loss"] = reg = regression_loss(video[:, 1:], targets)
      loss = loss + lam * reg
    if self.settings.gan:
      aux["gan_loss"] = lg = gan.generator_loss(gan.logits(sg(disc), feats))
      loss = loss + self.settings.gan_weight * lg
    return loss, aux

  def critic_loss(self, f, g, base, batch, key, disc=None):
    """``(loss, aux)``: the flow-matching loss of the critic ``base + F`` on a fresh (stop-gradient) student rollout
    (``aux["critic_loss"]``); with the GAN term plus ``gan_critic_weight`` times the head's loss on the training
    clip (real) against that rollout (fake): ``aux`` adds ``disc_loss`` and the mean probabilities ``disc_real``,
    ``disc_fake``."""
    sg = jax.lax.stop_gradient
    k_roll, k_t, k_sel = jax.random.split(key, 3)
    frozen = sg(base)
    video = sg(self.rollout(lora.apply_lora(frozen, sg(g), self.spec), batch, k_roll))
    t, eps, x_t = self._renoise(video, k_t)
    _, cams, context = self._inputs(batch)
    critic = lora.apply_lora(frozen, f, self.spec)
    on = self.settings.gan
    v = score_velocity(self.model, critic, video, x_t, t, cams, self.layout, context, k_sel, features=on)
    if on:
      v, fake_feats = v
    fm = flow_matching_loss(v, video[:, 1:], eps)
    aux = {"critic_loss": fm}
    if not on:
      return fm, aux
    real = self.real_video(batch)
    t_r, _, x_r = self._renoise(real, jax.random.fold_in(key, 7))
    _, real_feats = score_velocity(self.model, critic, real, x_r, t_r, cams, self.layout, context, k_sel,
                                   features=True)
    real_logits, fake_logits = gan.logits(disc, real_feats), gan.logits(disc, fake_feats)
    aux.update(disc_loss=gan.critic_loss(real_logits, fake_logits),
               disc_real=jnp.mean(jax.nn.sigmoid(real_logits)), disc_fake=jnp.mean(jax.nn.sigmoid(fake_logits)))
    return fm + self.settings.gan_critic_weight * aux["disc_loss"], aux

  def generator_update(self, state, base, batch, key):
    """One optimizer step of ``G`` (``F``, its optimizer state and ``step`` unchanged); ``key`` is used as is."""
    (loss, aux), grads = jax.value_and_grad(self.generator_loss, has_aux=True)(state.generator, state.critic, base,
                                                                               batch, key, state.disc)
    updates, opt = self.tx_gen.update(grads, state.gen_opt, state.generator)
    g = optax.apply_updates(state.generator, updates)
    del loss  # aux holds its terms
    metrics = {"gen_grad_norm": optax.tree.norm(grads), "gen_norm": _b_norm(g), **aux}
    return state.replace(generator=g, gen_opt=opt), metrics

  def critic_update(self, state, base, batch, key):
    """One optimizer step of ``F`` (``G``, its optimizer state and ``step`` unchanged); ``key`` is used as is."""
    (_, aux), (grads, disc_grads) = jax.value_and_grad(self.critic_loss, argnums=(0, 5), has_aux=True)(
        state.critic, state.generator, base, batch, key, state.disc)
    updates, opt = self.tx_critic.update(grads, state.critic_opt, state.critic)
    f = optax.apply_updates(state.critic, updates)
    metrics = {**aux, "critic_grad_norm": optax.tree.norm(grads), "critic_norm": _b_norm(f)}
    if state.disc is None:
      return state.replace(critic=f, critic_opt=opt), metrics
    updates, disc_opt = self.tx_disc.update(disc_grads, state.disc_opt, state.disc)
    metrics["disc_grad_norm"] = optax.tree.norm(disc_grads)
    return state.replace(critic=f, critic_opt=opt, disc=optax.apply_updates(state.disc, updates),
                         disc_opt=disc_opt), metrics

  def __call__(self, state, base, batch, key, train_generator):
    key = jax.random.fold_in(key, state.step)
    metrics = {}
    if train_generator:
      state, metrics = self.generator_update(state, base, batch, jax.random.fold_in(key, 0))
    state, m = self.critic_update(state, base, batch, jax.random.fold_in(key, 1))
    return state.replace(step=state.step + 1), {**metrics, **m}


def _b_norm(adapter):
  """Global norm of an adapter's ``b`` factors (zero at initialisation)."""
  return optax.tree.norm([b for _, b in lora.factors(adapter).values()])
