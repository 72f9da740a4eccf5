"""Distribution-matching distillation into a LoRA (jaxwm.distill): the DMD gradient on Gaussians with known
scores, the self-forcing rollout equals the streaming sampler at init, each update touches only its own
adapter, and a distillation run resumes exactly."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import apply_overrides, random_intrinsics, random_poses, tiny_config

from jaxwm import checkpoint as ckpt_lib
from jaxwm import lora
from jaxwm.lora import adapters
from jaxwm.diffusion import flow
from jaxwm.distill import dmd, gan
from jaxwm.models.conditioning import Cameras
from jaxwm.models.init import init_params
from jaxwm.sampling import streaming
from jaxwm.sampling.streaming import StreamingSampler
from jaxwm.training import sharding

F, CHUNK, B = 5, 2, 2  # 1 + 2 chunks of 2 latent frames of 16x16 frames (4x4x48 latents)
SPEC = lora.LoraSpec(rank=4, alpha=4.0)
CAMERA_PATH = ("plucker_in", "plucker_out", "mrope")


def _config(**overrides):
  from configs import distill  # pylint: disable=g-import-not-at-top
  c = tiny_config(**{"model.camera.encoding": "mrope", "model.camera.plucker": True, "data.batch_size": B,
                     "train.num_steps": 4, "train.ckpt_every": 2, "train.keep": 5, "seed": 3})
  c.distill = distill.get_config().distill
  c.distill.update(rank=SPEC.rank, alpha=SPEC.alpha, student_steps=2, critic_updates=2, lr_generator=1e-2,
                   lr_critic=1e-2, num_steps=4)
  return apply_overrides(c, overrides)


# ----------------------------------------------------------------------------------------------------------------
# (a) the DMD gradient on Gaussians


def _gaussian(x_t, t, m, s):
  """Exact velocity and score of data ``N(m, s^2)`` (per coordinate) noised to ``x_t = (1-t) x0 + t eps``."""
  t = t[:, None]
  var = (1 - t) ** 2 * s**2 + t**2
  x0 = m + (1 - t) * s**2 / var * (x_t - (1 - t) * m)
  return (x_t - x0) / t, -(x_t - (1 - t) * m) / var


def test_dmd_gradient_is_the_kl_direction_and_moves_the_student_to_the_teacher():
  mu_r, s_r, dims, n = 2.0, 0.5, 8, 256
  key = jax.random.key(0)
  # The DMD gradient is a positive multiple of the exact KL gradient (1 - t)(s_fake - s_real) for every sample.
  x0 = -1.0 + 2.0 * jax.random.normal(key, (n, dims))
  t = jax.random.uniform(jax.random.key(1), (n,), minval=0.02, maxval=0.98)
  x_t = (1 - t[:, None]) * x0 + t[:, None] * jax.random.normal(jax.random.key(2), (n, dims))
  (v_real, s_real), (v_fake, s_fake) = _gaussian(x_t, t, mu_r, s_r), _gaussian(x_t, t, -1.0, 2.0)
  grad, norm = dmd.distribution_matching_grad(x0, x_t, v_real, v_fake, t)
  assert norm.shape == (n, 1)
  kl = (1 - t[:, None]) * (s_fake - s_real)
  np.testing.assert_allclose(grad * norm * ((1 - t[:, None]) / t[:, None]) ** 2, kl, rtol=2e-3, atol=2e-4)
  np.testing.assert_allclose(jax.grad(lambda x: dmd.dmd_loss(x, grad))(x0) * grad.size, grad,  # d loss/d x0
                             rtol=1e-4, atol=1e-5)

  # Student x0 = mu_g + s_g z; the critic is the exact score of the current student distribution N(mu_g, s_g^2).
  def loss(theta, key):
    mu, log_s = theta
    k1, k2, k3 = jax.random.split(key, 3)
    x0 = mu + jnp.exp(log_s) * jax.random.normal(k1, (n, dims))
    t = jax.random.uniform(k2, (n,), minval=0.02, maxval=0.98)
    x_t = (1 - t[:, None]) * jax.lax.stop_gradient(x0) + t[:, None] * jax.random.normal(k3, (n, dims))
    v_real = _gaussian(x_t, t, mu_r, s_r)[0]
    v_fake = _gaussian(x_t, t, jax.lax.stop_gradient(mu), jax.lax.stop_gradient(jnp.exp(log_s)))[0]
    return dmd.dmd_loss(x0, dmd.distribution_matching_grad(x0, x_t, v_real, v_fake, t)[0])

  grad_fn = jax.jit(jax.grad(loss))
  theta = jnp.array([-1.0, np.log(2.0)])
  path = [theta]
  for i in range(30):
    theta = theta - 0.1 * dims * grad_fn(theta, jax.random.key(10 + i))
    path.append(theta)
  mus, sigmas = np.array([p[0] for p in path]), np.exp(np.array([p[1] for p in path]))
  assert mus[1] > mus[0] and sigmas[1] < sigmas[0]  # the first step already points at the teacher
  assert abs(mus[-1] - mu_r) < 0.01 * abs(mus[0] - mu_r), mus
  assert abs(sigmas[-1] - s_r) < 0.01 * abs(sigmas[0] - s_r), sigmas


# ----------------------------------------------------------------------------------------------------------------
# (b), (c) the rollout and the updates


@pytest.fixture(scope="module", name="setup")
def _setup(tmp_path_factory):
  from jaxwm.distill.loop import Distiller  # pylint: disable=g-import-not-at-top
  c = _config()
  # The run loop's jitted updates (shared with the runs of the resume test: compiled once).
  dist = Distiller(c, tmp_path_factory.mktemp("unused"), mesh=_mesh())
  model = dist.model
  base = jax.jit(lambda k: nn.unbox(init_params(model, k, (1, F, 4, 4, 48), 16)))(jax.random.key(0))
  # A base whose camera path matters: non-zero Plücker output (zero at init).
  base["plucker_out"] = jax.tree_util.tree_map(lambda a: 0.05 * jax.random.normal(jax.random.key(9), a.shape),
                                               base["plucker_out"])
  base = jax.device_put(base, dist.base_shardings)  # as the run loop's restored teacher: one compiled update
  rng = np.random.default_rng(0)
  c2w = np.stack([random_poses(rng, F, 0.3) for _ in range(B)])
  c2w = np.linalg.inv(c2w[:, :1]) @ c2w  # re-anchored on frame 0
  host = {"frames": rng.integers(0, 256, (B, F, 16, 16, 3)).astype(np.uint8), "c2w": c2w.astype(np.float32),
          "intrinsics": np.stack([random_intrinsics(rng, F, (16, 16)) for _ in range(B)]).astype(np.float32)}
  return dict(config=c, dist=dist, model=model, base=base, batch=dist.put_batch(host), settings=dist.settings,
              state=dist.init_state(base))


def _mesh():
  return sharding.make_mesh(1, 1, jax.devices()[:1])


def test_student_rollout_at_init_is_the_base_few_step_sampler(setup):
  """At init (LoRA factors b = 0: the adapted weights equal the base bit for bit, tests/test_lora.py) DMD's
  student rollout is the base model's few-step streaming sampler: the first latent exactly, the rest to float32
  round-off (two different programs; the tests' XLA flags may fuse them differently), and an early exit differs."""
  model, base, batch, settings = setup["model"], setup["base"], setup["batch"], setup["settings"]
  first = dmd.first_latents(batch, 4)
  cams = Cameras(batch["c2w"], batch["intrinsics"])
  key = jax.random.key(5)
  sampler = StreamingSampler(model, {"params": base}, batch_size=B, max_frames=F, latent_hw=(4, 4), channels=48,
                             num_steps=settings.student_steps, shift=settings.shift)
  want = sampler.rollout(first, F, CHUNK, key, {"c2w": cams.c2w, "intrinsics": cams.intrinsics})
  roll = jax.jit(lambda p, g, exits: dmd.student_rollout(model, lora.apply_lora(p, g, SPEC), first, cams, key,
                                                         settings.schedule, CHUNK, F, exit_steps=exits))
  g0 = setup["state"].generator
  got = np.asarray(roll(base, g0, jnp.full((2,), settings.student_steps - 1)))
  np.testing.assert_array_equal(got[:, 0], want[:, 0])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  early = np.asarray(roll(base, g0, jnp.zeros((2,), jnp.int32)))  # one-jump prediction at step 0
  np.testing.assert_array_equal(early[:, 0], want[:, 0])
  assert np.abs(early[:, 1:] - want[:, 1:]).max() > 1e-3


def test_a_scaled_noise_student_streams_as_the_sampler_with_that_noise_scale(setup):
  """``noise_scale`` s: the sampler starts each chunk from ``s * normal(key)`` (checked against the denoiser fed
  that noise by hand), the student's rollout is that sampler at init, and the teacher's regression targets
  still start from the unscaled noise (chunk 0's history is the first frame alone in both, so equal)."""
  model, base, batch, settings = setup["model"], setup["base"], setup["batch"], setup["settings"]
  first = dmd.first_latents(batch, 4)
  cams = Cameras(batch["c2w"], batch["intrinsics"])
  key, s = jax.random.key(7), 0.5
  with pytest.raises(ValueError, match="noise_scale=0.0: must be > 0"):
    StreamingSampler(model, {"params": base}, batch_size=B, max_frames=F, latent_hw=(4, 4), channels=48,
                     noise_scale=0.0)
  sampler = StreamingSampler(model, {"params": base}, batch_size=B, max_frames=F, latent_hw=(4, 4), channels=48,
                             num_steps=settings.student_steps, shift=settings.shift, noise_scale=s)
  cache = sampler.start(first, cams.frames(slice(0, 1)))
  x, pos, row_cams, _ = sampler.denoise_chunk(cache, jax.random.fold_in(key, 1), CHUNK, cams.frames(slice(1, 3)))
  z = s * jax.random.normal(jax.random.fold_in(key, 1), (B, CHUNK, 4, 4, 48))
  by_hand = streaming.denoise(model, {"params": base}, cache, z, pos, sampler.schedule, cameras=row_cams)
  np.testing.assert_allclose(np.asarray(x), np.asarray(by_hand), rtol=1e-5, atol=1e-5)
  want = sampler.rollout(first, F, CHUNK, key, {"c2w": cams.c2w, "intrinsics": cams.intrinsics})
  roll = jax.jit(lambda p, g, scale: dmd.student_rollout(
      model, lora.apply_lora(p, g, SPEC), first, cams, key, settings.schedule, CHUNK, F, teacher=p,
      teacher_schedule=settings.regression_schedule, noise_scale=scale))
  g0 = setup["state"].generator
  video, targets = map(np.asarray, roll(base, g0, s))
  np.testing.assert_allclose(video, want, rtol=1e-5, atol=1e-5)
  video1, targets1 = map(np.asarray, roll(base, g0, 1.0))
  assert np.abs(video1[:, 1:] - video[:, 1:]).max() > 1e-2  # the scale reaches the student
  np.testing.assert_allclose(targets[:, :CHUNK], targets1[:, :CHUNK], rtol=1e-6, atol=1e-6)
  assert dataclasses.replace(settings, noise_scale=s).adapter_extra()["noise_scale"] == s


def test_regression_targets_are_the_teachers_samples_on_the_students_history(setup):
  """Each chunk's ODE-regression target is the teacher's T-step sample from that chunk's noise against the
  student's own history: checked against the streaming sampler of the teacher, fed the student's chunk 0 by
  hand. A student that is the teacher at T steps has its own samples as targets."""
  model, base, batch, settings = setup["model"], setup["base"], setup["batch"], setup["settings"]
  first = dmd.first_latents(batch, 4)
  cams = Cameras(batch["c2w"], batch["intrinsics"])
  key, teacher_steps = jax.random.key(6), 3
  teacher_schedule = np.asarray(flow.sampling_schedule(teacher_steps, settings.shift), np.float32)
  roll = jax.jit(lambda p, g, sched: dmd.student_rollout(model, lora.apply_lora(p, g, SPEC), first, cams, key,
                                                         settings.schedule, CHUNK, F, teacher=p,
                                                         teacher_schedule=sched))
  g0 = setup["state"].generator
  video, targets = map(np.asarray, roll(base, g0, teacher_schedule))
  assert targets.shape == video[:, 1:].shape
  teacher = StreamingSampler(model, {"params": base}, batch_size=B, max_frames=F, latent_hw=(4, 4), channels=48,
                             num_steps=teacher_steps, shift=settings.shift)
  cache = teacher.start(first, cams.frames(slice(0, 1)))
  for c in range(2):  # chunk c: the teacher from noise fold_in(key, c + 1); then the *student's* chunk committed
    lo, hi = 1 + c * CHUNK, 1 + (c + 1) * CHUNK
    x, pos, row_cams, views = teacher.denoise_chunk(cache, jax.random.fold_in(key, c + 1), CHUNK,
                                                    cams.frames(slice(lo, hi)))
    np.testing.assert_allclose(targets[:, lo - 1:hi - 1], np.asarray(x), rtol=1e-5, atol=1e-5)
    cache = teacher.commit_chunk(cache, key, jnp.asarray(video[:, lo:hi]), pos, row_cams, views=views)
  assert np.abs(targets - video[:, 1:]).mean() > 1e-3  # 2 student steps are not the teacher's 3
  same_video, same_targets = map(np.asarray, roll(base, g0, settings.schedule))  # at init: the teacher at 2 steps
  np.testing.assert_allclose(same_targets, same_video[:, 1:], rtol=1e-5, atol=1e-5)


def test_the_regression_term_pulls_the_student_to_the_teachers_samples(setup):
  """At init the critic is the teacher, so DMD's gradient is zero and a generator update follows the regression
  term alone: on a fixed batch and key a few updates lower it (a 1-step student, targets at 2 teacher steps)."""
  dist, base, batch = setup["dist"], setup["base"], setup["batch"]
  settings = dataclasses.replace(setup["settings"], student_steps=1, regression_weight=1.0, regression_steps=2)
  step = dmd.DistillStep(dist.model, dist.layout, SPEC, settings, dist.tx_gen, dist.tx_critic)
  update = jax.jit(lambda s: step.generator_update(s, base, batch, jax.random.key(3)))
  state = dist.init_state(base)
  losses = []
  for _ in range(4):
    state, m = update(state)
    losses.append(float(m["regression_loss"]))
    assert float(m["dmd_loss"]) == 0.0 and float(m["score_gap"]) == 0.0  # the critic is still the teacher
  assert losses[0] > 1e-3 and losses[-1] < 0.9 * losses[0], losses
  with pytest.raises(ValueError, match="regression_weight=1.0: the regression targets are the unguided"):
    dataclasses.replace(settings, guidance=2.0)


def test_generator_step_changes_only_g_and_critic_step_only_f(setup):
  dist, base, batch = setup["dist"], setup["base"], setup["batch"]
  base_before = jax.tree_util.tree_map(np.array, base)
  critic = lambda s, k: dist.critic_update(s, base, batch, k)  # pylint: disable=unnecessary-lambda-assignment
  generator = lambda s, k: dist.generator_update(s, base, batch, k)  # pylint: disable=unnecessary-lambda-assignment
  leaves = lambda t: [np.asarray(x) for x in jax.tree_util.tree_leaves(t)]  # pylint: disable=unnecessary-lambda-assignment
  state = dist.init_state(base)  # the updates donate their input state: a fresh one
  state_before = jax.tree_util.tree_map(np.array, state)

  s1, m1 = critic(state, jax.random.key(1))
  s1_host = jax.tree_util.tree_map(np.array, s1)
  assert np.isfinite(float(m1["critic_loss"])) and float(m1["critic_norm"]) > 0 and int(s1.step) == 1
  for a, b in zip(leaves((s1.generator, s1.gen_opt)), leaves((state_before.generator, state_before.gen_opt))):
    np.testing.assert_array_equal(a, b)
  assert all(np.any(b != b0) for (_, b), (_, b0) in zip(lora.factors(s1.critic).values(),
                                                         lora.factors(state_before.critic).values()))
  # At init the critic is the teacher (zero DMD gradient); after one critic step the generator gets a gradient.
  s2, m2 = generator(s1, jax.random.key(2))
  assert float(m2["gen_grad_norm"]) > 0 and float(m2["score_gap"]) > 0
  for a, b in zip(leaves((s2.critic, s2.critic_opt, s2.step)), leaves((s1_host.critic, s1_host.critic_opt,
                                                                       s1_host.step))):
    np.testing.assert_array_equal(a, b)
  changed = [p for p, (_, b) in lora.factors(s2.generator).items() if np.any(np.asarray(b) != 0)]
  assert changed == sorted(lora.factors(s2.generator))
  # The base is untouched; the merged student differs from it on LoRA targets only, never on the camera path.
  for a, b in zip(leaves(base), leaves(base_before)):
    np.testing.assert_array_equal(a, b)
  merged, flat = lora.flat_paths(lora.merge(base, s2.generator, SPEC)), lora.flat_paths(base_before)
  differ = sorted(p for p in flat if np.any(np.asarray(merged[p]) != flat[p]))
  assert differ == lora.lora_targets(base, SPEC)
  assert not [p for p in differ if any(name in p for name in CAMERA_PATH)]
  assert [p for p in flat if "plucker_out" in p] and [p for p in flat if "mrope" in p]


# ----------------------------------------------------------------------------------------------------------------
# (d) the run loop: exact resume, the adapter, refusals


@pytest.fixture(scope="module", name="teacher")
def _teacher(tmp_path_factory):
  """A teacher workdir: a checkpoint of the (initialised) model of :func:`_config`."""
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp("teacher")
  c = _config()
  del c["distill"]
  tr = Trainer(c, workdir, mesh=_mesh())
  state = tr.init_state()
  ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", async_save=False)
  ckpt.save(3, state, None, c)
  ckpt.close()
  return workdir


def _metrics(workdir):
  lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in x.items() if k != "steps_per_s"} for x in lines]


def test_distillation_resumes_exactly_and_saves_the_adapter(teacher, tmp_path, capsys):
  from jaxwm.distill.loop import run  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import ResumeConfigError, RunRefusedError  # pylint: disable=g-import-not-at-top
  mesh = _mesh()
  c4 = _config(**{"distill.teacher": str(teacher)})
  straight, hist_a = run(c4, tmp_path / "a", mesh=mesh, progress=False)
  run(_config(**{"distill.teacher": str(teacher), "distill.num_steps": 2}), tmp_path / "b", mesh=mesh, progress=False)
  resumed, hist_b = run(c4, tmp_path / "b", mesh=mesh, progress=False)  # from step 2
  assert len(hist_a) == 4 and hist_b == hist_a[2:] and all(np.isfinite(hist_a))
  assert int(resumed.step) == int(straight.step) == 4
  for a, b in zip(jax.tree_util.tree_leaves(resumed), jax.tree_util.tree_leaves(straight)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
  m = _metrics(tmp_path / "a")
  assert [x["step"] for x in m] == [1, 2, 3, 4] and [x["generator_updates"] for x in m] == [1, 0, 1, 0]
  assert m[2]["gen_grad_norm"] > 0 and "dmd_loss" not in m[1]
  # The adapter of every checkpoint, with the few-step settings; it is G.
  meta = adapters.adapter_metadata(tmp_path / "a" / "adapter")
  assert meta["extra"]["num_steps"] == 2 and meta["extra"]["teacher_step"] == 3
  np.testing.assert_allclose(meta["extra"]["timesteps"], flow.sampling_schedule(2, c4.distill.shift), rtol=1e-6)
  assert sorted(ckpt_lib.step_dirs(tmp_path / "a" / "adapter")) == [2, 4]
  from jaxwm.sampling.load import load_model  # pylint: disable=g-import-not-at-top
  base = load_model(teacher)[2]["params"]
  adapter, spec = adapters.load_adapter(tmp_path / "a" / "adapter", base)
  assert spec == SPEC
  jax.tree_util.tree_map(np.testing.assert_array_equal, adapter, jax.tree_util.tree_map(np.asarray,
                                                                                        straight.generator))
  # The noise scale it was trained from (1 here) is what samplers of the adapter use.
  from jaxwm.distill.student import apply_adapter  # pylint: disable=g-import-not-at-top
  assert meta["extra"]["noise_scale"] == 1.0
  adapters.save_adapter(tmp_path / "scaled", adapter, spec, base, extra={**meta["extra"], "noise_scale": 0.5})
  config = load_model(teacher)[0]
  _, note = apply_adapter(config, {"params": base}, tmp_path / "scaled")
  assert config.sample.noise_scale == 0.5 and "noise scale 0.5" in note, note
  # Refusals: another LoRA rank on resume; a missing teacher (before the workdir is created).
  with pytest.raises(ResumeConfigError, match="distill.rank: 4 \\(checkpoint\\) != 8"):
    run(_config(**{"distill.teacher": str(teacher), "distill.rank": 8, "distill.num_steps": 6}), tmp_path / "a",
        mesh=mesh, progress=False)
  with pytest.raises(ResumeConfigError, match="distill.targets: 'blocks' \\(checkpoint\\) != 'blocks_io'"):
    run(_config(**{"distill.teacher": str(teacher), "distill.targets": "blocks_io", "distill.num_steps": 6}),
        tmp_path / "a", mesh=mesh, progress=False)
  with pytest.raises(ResumeConfigError, match="distill.gan_weight: 0.0 \\(checkpoint\\) != 0.1"):
    run(_config(**{"distill.teacher": str(teacher), "distill.gan_weight": 0.1, "distill.num_steps": 6}),
        tmp_path / "a", mesh=mesh, progress=False)
  with pytest.raises(RunRefusedError, match="distill.teacher='': pass the teacher's training workdir"):
    run(_config(), tmp_path / "c", mesh=mesh, progress=False)
  assert not (tmp_path / "c").exists()
  # sample.py --adapter: the distillation workdir's adapter merged, its 2 steps taken, its name in the output's.
  import sample  # pylint: disable=g-import-not-at-top
  out = tmp_path / "s.gif"
  assert sample.main(["--workdir", str(teacher), "--adapter", str(tmp_path / "a"), "--out", str(out)]) == 0
  printed = capsys.readouterr().out
  assert "sample.py: adapter" in printed and "; 2 steps" in printed and out.exists(), printed
  assert sample.main(["--workdir", str(teacher), "--adapter", str(tmp_path / "c")]) == 2
  assert "--adapter=" in capsys.readouterr().err


def test_a_checkpoint_saved_before_a_distill_key_existed_resumes_with_its_default():
  from jaxwm.distill.loop import _distill_differences  # pylint: disable=g-import-not-at-top
  now = _config()
  saved = {"distill": {k: v for k, v in now.distill.to_dict().items() if k != "targets"}}  # before `targets`
  resolved = {}
  assert _distill_differences(resolved)(saved, now) == ([], []) and resolved["teacher_step"] == -1
  other = _config(**{"distill.targets": "blocks_io", "distill.lr_generator": 0.5})
  refused, logged = _distill_differences({})(saved, other)
  assert refused == [("distill.targets", "blocks", "blocks_io")]
  assert logged == [("distill.lr_generator", now.distill.lr_generator, 0.5)]


def test_fsdp_sharded_adapters_update_like_one_device(setup, tmp_path):
  """On an FSDP mesh the factors and their optimizer state are sharded like the kernels they adapt
  (``lora.factor_shardings``), and a critic then a generator update give the one-device result."""
  from jaxwm.distill.loop import Distiller  # pylint: disable=g-import-not-at-top
  one, base = setup["dist"], jax.tree_util.tree_map(np.asarray, setup["base"])
  mesh = sharding.make_mesh(1, B, jax.devices()[:B])
  dist = Distiller(_config(), tmp_path, mesh=mesh)
  split = [s for s in jax.tree_util.tree_leaves(dist.state_shardings.generator) if "fsdp" in str(s.spec)]
  assert split and any("fsdp" in str(s.spec) for s in jax.tree_util.tree_leaves(dist.state_shardings.gen_opt))
  rng = np.random.default_rng(1)
  c2w = np.stack([random_poses(rng, F, 0.3) for _ in range(B)])
  host = {"frames": rng.integers(0, 256, (B, F, 16, 16, 3)).astype(np.uint8),
          "c2w": (np.linalg.inv(c2w[:, :1]) @ c2w).astype(np.float32),
          "intrinsics": np.stack([random_intrinsics(rng, F, (16, 16)) for _ in range(B)]).astype(np.float32)}
  results = []
  for d in (one, dist):
    b = jax.device_put(base, d.base_shardings)
    state, batch = d.init_state(b), d.put_batch(host)
    state, m1 = d.critic_update(state, b, batch, jax.random.key(1))
    state, m2 = d.generator_update(state, b, batch, jax.random.key(2))
    results.append(jax.tree_util.tree_map(np.asarray, ((state.generator, state.critic), {**m1, **m2})))
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-3), results[0][1], results[1][1])
  # Adam's first steps are about lr * sign(g) (lr 1e-2): a factor updated the other way would be 2e-2 off.
  # An entry whose gradient is near Adam's eps moves by lr * dg / eps, so the sharded reduction order's round-off
  # shows there: 4e-5 with the random exit, 1e-4 to 3e-4 with the default "last" (its gradient runs through the
  # whole chunk schedule). 2e-3 stays 10x under a flipped update.
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-3), results[0][0], results[1][0])


# ----------------------------------------------------------------------------------------------------------------
# (e) DMD2's GAN term


def test_gan_losses_and_head_closed_forms():
  head = gan.init_head(jax.random.key(0), 8)
  assert {k: v.shape for k, v in head.items()} == {"w1": (8, 8), "b1": (8,), "w2": (8, 1), "b2": (1,)}
  zero = jnp.zeros((2, 5))
  np.testing.assert_allclose(gan.critic_loss(zero, zero), 2 * np.log(2), rtol=1e-6)
  np.testing.assert_allclose(gan.generator_loss(zero), np.log(2), rtol=1e-6)
  np.testing.assert_allclose(gan.critic_loss(zero + 30, zero - 30), 0, atol=1e-12)  # certain and right
  np.testing.assert_allclose(gan.generator_loss(zero - 30), 30, rtol=1e-6)
  # The head's layer norm has no parameters: logits are invariant to a token's scale and offset.
  h = jax.random.normal(jax.random.key(1), (2, 5, 8))
  want = np.asarray(gan.logits(head, h))
  np.testing.assert_allclose(gan.logits(head, 3 * h + 1), want, rtol=1e-4, atol=1e-5)
  # float64 brute force of the two-layer head on one token.
  x = np.asarray(h[1, 2], np.float64)
  x = (x - x.mean()) / np.sqrt(x.var() + 1e-6)
  pre = x @ np.asarray(head["w1"], np.float64) + np.asarray(head["b1"], np.float64)
  z = (pre / (1 + np.exp(-pre))) @ np.asarray(head["w2"], np.float64)[:, 0] + float(head["b2"][0])
  np.testing.assert_allclose(want[1, 2], z, rtol=1e-5)


def test_critic_features_are_the_noisy_tokens_in_order(setup):
  """``score_velocity(features=True)``: the same velocities, and ``[B, noisy tokens, D]`` hidden states ordered like
  the noisy frames: changing only the last chunk's noisy input leaves the first chunk's features (chunk-causal)
  and velocities as they were and changes the last chunk's."""
  model, base, batch = setup["model"], setup["base"], setup["batch"]
  layout = setup["dist"].layout
  cams = Cameras(batch["c2w"], batch["intrinsics"])
  video = jax.random.normal(jax.random.key(3), (B, F, 4, 4, 48))
  t = jnp.full((B, F - 1), 0.5)
  x_t = jax.random.normal(jax.random.key(4), (B, F - 1, 4, 4, 48))
  fn = jax.jit(lambda x, feats: dmd.score_velocity(model, base, video, x, t, cams, layout, features=feats),
               static_argnums=1)
  v, h = fn(x_t, True)
  n = (4 // model.cfg.patch_size[1]) * (4 // model.cfg.patch_size[2])  # tokens per 4x4 latent frame
  assert h.shape == (B, (F - 1) * n, model.cfg.dim)
  np.testing.assert_allclose(v, fn(x_t, False), rtol=1e-5, atol=1e-6)
  v2, h2 = fn(x_t.at[:, CHUNK:].add(1.0), True)
  np.testing.assert_allclose(h2[:, :CHUNK * n], h[:, :CHUNK * n], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(v2[:, :CHUNK], v[:, :CHUNK], rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(h2[:, CHUNK * n:] - h[:, CHUNK * n:])).max() > 1e-2


@pytest.fixture(scope="module", name="gan_setup")
def _gan_setup(setup, tmp_path_factory):
  from jaxwm.distill.loop import Distiller  # pylint: disable=g-import-not-at-top
  dist = Distiller(_config(**{"distill.gan_weight": 0.1, "distill.gan_critic_weight": 0.5}),
                   tmp_path_factory.mktemp("gan"), mesh=_mesh())
  rng = np.random.default_rng(0)
  host = {k: np.asarray(v) for k, v in setup["batch"].items() if k != "frames"}
  host["frames"] = rng.integers(0, 256, (B, F, 16, 16, 3)).astype(np.uint8)
  host["frames"][:, :1] = np.asarray(setup["batch"]["frames"])
  return dict(dist=dist, host=host, base=setup["base"])


def test_gan_critic_step_trains_critic_and_head_on_whole_clips(gan_setup):
  dist, host, base = gan_setup["dist"], gan_setup["host"], gan_setup["base"]
  batch = dist.put_batch(host)
  assert batch["frames"].shape[1] == F  # whole clips: the real samples
  state = dist.init_state(base)
  assert state.disc is not None and state.disc_opt is not None
  before = jax.tree_util.tree_map(np.array, state)
  s1, m = dist.critic_update(state, base, batch, jax.random.key(1))
  for k in ("critic_loss", "disc_loss", "disc_real", "disc_fake", "disc_grad_norm"):
    assert np.isfinite(float(m[k])), k
  assert float(m["disc_grad_norm"]) > 0
  assert all(np.any(np.asarray(a) != b) for a, b in zip(jax.tree_util.tree_leaves(s1.disc),
                                                       jax.tree_util.tree_leaves(before.disc)))
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.tree_util.tree_map(np.asarray, s1.generator),
                         before.generator)
  # The real samples are the clip's later frames: changing them moves the head's loss, not the flow-matching one.
  other = {**host, "frames": host["frames"].copy()}
  other["frames"][:, 1:] = 255 - other["frames"][:, 1:]
  step = dist.step_fn
  loss = jax.jit(lambda b: step.critic_loss(before.critic, before.generator, base, b, jax.random.key(1),
                                            before.disc)[1])
  a, b = loss(batch), loss(dist.put_batch(other))
  np.testing.assert_allclose(a["critic_loss"], b["critic_loss"], rtol=1e-6)
  assert abs(float(a["disc_loss"]) - float(b["disc_loss"])) > 1e-4


def test_gan_generator_term_reaches_the_student(gan_setup):
  dist, host, base = gan_setup["dist"], gan_setup["host"], gan_setup["base"]
  batch, step = dist.put_batch(host), dist.step_fn
  state, _ = dist.critic_update(dist.init_state(base), base, batch, jax.random.key(1))
  kept = jax.tree_util.tree_map(np.array, (state.disc, state.critic))  # the update donates its input state
  term = jax.jit(jax.grad(lambda g: step.generator_loss(g, state.critic, base, batch, jax.random.key(2),
                                                        state.disc)[1]["gan_loss"]))
  grads = term(state.generator)
  assert float(optax_norm(grads)) > 0
  s2, m = dist.generator_update(state, base, batch, jax.random.key(2))
  assert np.isfinite(float(m["gan_loss"])) and float(m["gen_grad_norm"]) > 0 and "disc_loss" not in m
  for a, b in zip(jax.tree_util.tree_leaves((s2.disc, s2.critic)), jax.tree_util.tree_leaves(kept)):
    np.testing.assert_array_equal(np.asarray(a), b)


def optax_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(tree)))


def test_gan_distillation_resumes_exactly(teacher, tmp_path):
  """The head and its optimizer state are checkpointed: 3 iterations straight equal 2, then a resume to 3."""
  from jaxwm.distill.loop import run  # pylint: disable=g-import-not-at-top
  gan_on = {"distill.teacher": str(teacher), "distill.gan_weight": 0.1}
  c3 = _config(**gan_on, **{"distill.num_steps": 3})
  straight, hist_a = run(c3, tmp_path / "a", mesh=_mesh(), progress=False)
  run(_config(**gan_on, **{"distill.num_steps": 2}), tmp_path / "b", mesh=_mesh(), progress=False)
  resumed, hist_b = run(c3, tmp_path / "b", mesh=_mesh(), progress=False)
  assert hist_b == hist_a[2:] and straight.disc is not None
  for a, b in zip(jax.tree_util.tree_leaves(resumed), jax.tree_util.tree_leaves(straight)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  m = _metrics(tmp_path / "a")
  assert "gan_loss" in m[0] and "disc_real" in m[-1]


def test_a_distillation_checkpoint_from_before_the_gan_head_restores(setup, tmp_path):
  """A state saved before ``DistillState.disc`` / ``disc_opt`` existed (the old layout: no such keys) restores
  into today's state without the GAN term, every array equal; a state with the head restores its head."""
  dist, base = setup["dist"], setup["base"]
  state = jax.tree_util.tree_map(np.asarray, dist.init_state(base))
  ck = ckpt_lib.Checkpointer(tmp_path / "old", async_save=False)
  ck.save(1, {k: getattr(state, k) for k in ("step", "generator", "critic", "gen_opt", "critic_opt")})
  restored, step = ck.restore(dist.restore_target())
  ck.close()
  assert step == 1 and restored.disc is None and restored.disc_opt is None
  for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), b)
