"""Proven for accelerators this machine lacks: the Pallas kernels compile with the real Mosaic TPU
compiler for abstract v4/v5e/v5p/v6e chips (forward and backward), the GPU kernels lower to
Triton whatever jax's default Pallas GPU backend is, and ``train.py --compile_only`` compiles the
sharded train step and the streaming step for a TPU topology and reports memory and FLOPs."""

import jax
import jax.numpy as jnp
import pytest
from conftest import tiny_config

from jaxwm import kernels

needs_libtpu = pytest.mark.skipif(__import__("importlib").util.find_spec("libtpu") is None,
                                  reason="libtpu (pip install 'jax[tpu]', in the test extras) compiles for TPUs")

# Wan's attention head (D = 128), 480x832 latents (390 tokens per frame), bf16; the tiny model's head.
SHAPES = {"wan": dict(heads=4, head_dim=128, tokens=390, frames=8, slots=4, dtype=jnp.bfloat16, t=1024),
          "tiny": dict(heads=4, head_dim=48, tokens=16, frames=9, slots=3, dtype=jnp.float32, t=64)}


def _programs(impl, shape, sharding=None, grads_only=False):
  """``{name: (function, abstract args)}``: frame-sparse and delta-rule kernels, forward and backward
  (``grads_only``: the gradients alone, whose programs run the forward kernels too)."""
  s = shape
  sds = lambda shp, dt: jax.ShapeDtypeStruct(shp, dt, sharding=sharding)  # pylint: disable=unnecessary-lambda-assignment
  q = sds((1, s["frames"] * s["tokens"], s["heads"], s["head_dim"]), s["dtype"])
  idx = sds((1, s["frames"], s["slots"]), jnp.int32)

  def fs(q, k, v, i):
    return kernels.gathered_attention(q, k, v, i, tokens_per_frame=s["tokens"], impl=impl)

  def fs_grad(q, k, v, i):
    return jax.grad(lambda q, k, v: fs(q, k, v, i).astype(jnp.float32).sum(), (0, 1, 2))(q, k, v)

  x = sds((1, s["t"], 2, s["head_dim"]), jnp.float32)
  beta = sds((1, s["t"], 2), jnp.float32)

  def dr(*a):
    return kernels.delta_rule_chunked(*a, impl=impl)[0]

  def dr_grad(*a):
    return jax.grad(lambda *a: dr(*a).sum(), tuple(range(5)))(*a)

  grads = {"frame_sparse_grad": (fs_grad, (q, q, q, idx)), "delta_rule_grad": (dr_grad, (x, x, x, x, beta))}
  if grads_only:
    return grads
  return {"frame_sparse": (fs, (q, q, q, idx)), "delta_rule": (dr, (x, x, x, x, beta)), **grads}


@needs_libtpu
@pytest.mark.parametrize("topology,shape", [("v5e:2x2", "wan"), ("v5p:2x2x1", "wan"), ("v6e:2x2", "wan"),
                                            ("v4:2x2x1", "wan"), ("v5e:2x2", "tiny")])
def test_pallas_kernels_compile_for_tpu(topology, shape):
  from jax.sharding import SingleDeviceSharding  # pylint: disable=g-import-not-at-top
  from jaxwm.training.compile_only import topology_devices  # pylint: disable=g-import-not-at-top
  one = SingleDeviceSharding(topology_devices(topology)[0])
  for name, (fn, args) in _programs("pallas_tpu", SHAPES[shape], one, grads_only=True).items():
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert text.count("tpu_custom_call") >= 2, name  # forward and backward Mosaic kernels, no XLA fallback


@pytest.mark.parametrize("shape", ["wan", "tiny"])
def test_gpu_kernels_lower_to_triton_whatever_the_default_backend(shape):
  from jax import export  # pylint: disable=g-import-not-at-top
  assert jax.config.jax_pallas_use_mosaic_gpu  # jax's default Pallas GPU backend: the kernels must ask for Triton
  triton = "__gpu$xla.gpu.triton"
  for name, (fn, args) in _programs("pallas_gpu", SHAPES[shape]).items():
    exp = export.export(jax.jit(fn), platforms=["cuda"],
                        disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)])(*args)
    text = exp.mlir_module()
    assert triton in text and "mosaic_gpu" not in text, name


@needs_libtpu
def test_compile_only_reports_memory_and_flops(capsys):
  from jaxwm.training import compile_only  # pylint: disable=g-import-not-at-top
  c = tiny_config()
  c.mesh.update(data=2, fsdp=2)
  lines, fits = compile_only.run(c, "v5e:2x2", "train")
  assert fits and "4 chips of v5e" in lines[0]
  assert "of 16 GiB HBM -> fits" in lines[1] and "roofline lower bound" in lines[2]
  lines, fits = compile_only.run(c, "v5e:2x2", "sample")
  assert fits and any(line.startswith("commit chunk") for line in lines)
  assert "roofline" in capsys.readouterr().out
  with pytest.raises(ValueError, match="--topology='v9:2x2'"):
    compile_only.run(c, "v9:2x2")
  with pytest.raises(ValueError, match="mesh"):  # 8 devices asked of a 4-chip topology
    c.mesh.update(data=4, fsdp=2)
    compile_only.run(c, "v5e:2x2")


@needs_libtpu
def test_compile_only_with_pallas_kernels_on_a_sharded_mesh():
  """Frame-sparse and LOCI kernels inside the sharded train step (run per batch shard in shard_map)."""
  from jaxwm.training import compile_only  # pylint: disable=g-import-not-at-top
  sparse = tiny_config(**{"data.num_frames": 7, "data.clip_frames": 13})
  sparse.model.attention.update(sparsity="frame_topk", top_k=1, num_samples=4, impl="pallas_tpu")
  loci = tiny_config()
  loci.model.loci.update(enabled=True, blocks=(1,), chunk_size=16, impl="pallas_tpu")
  for c in (sparse, loci):
    c.mesh.update(data=2, fsdp=2)
    assert compile_only.run(c, "v5e:2x2", "train")[1]


@needs_libtpu
def test_compile_only_with_splash_attention_on_a_sharded_mesh():
  """Dense teacher forcing with ``model.attention_impl="splash"``: the sharded train step compiles with
  splash's Mosaic kernels (per batch shard in shard_map) and no dense score matrix."""
  from jaxwm.training import compile_only  # pylint: disable=g-import-not-at-top
  c = tiny_config()
  c.model.attention_impl = "splash"
  c.mesh.update(data=2, fsdp=2)
  assert compile_only.run(c, "v5e:2x2", "train")[1]
  with pytest.raises(ValueError, match=r"'splash' \(a TPU kernel; .*\) cannot be lowered for platform cpu"):
    compile_only.compile_train(c, jax.devices()[:4])


@needs_libtpu
def test_compile_only_compiles_a_records_config_before_any_video_is_ingested(tmp_path, capsys):
  """``train.py --compile_only train --frame_size HxW`` on a records config with cross-attention and no dataset:
  the batch is what the loader would give, ingested ``latents`` at the VAE's geometry for that frame size and
  ``text_emb [B, 512, text_dim]``; it compiles and writes no workdir. Misused, ``--frame_size`` is refused."""
  from jaxwm.cli.train import cli  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.training import compile_only  # pylint: disable=g-import-not-at-top
  records = {"data.source": "records", "data.vae": "wan2.2-tiny:0", "data.text_encoder": "umt5-tiny:0",
             "data.latent_stride": 16, "model.in_channels": 8, "model.out_channels": 8, "model.camera.vae_stride": 16,
             "model.cross_attn": True, "model.text_dim": 16, "data.num_frames": 5, "data.frame_stride": 1}
  c = tiny_config(**records)
  c.data.data_dir = compile_only.stand_in_dataset(tmp_path / "ds", c.data, (64, 96), 16)
  batch = compile_only._records_batch(c, ModelConfig.from_dict(c.model))  # pylint: disable=protected-access
  assert batch["latents"].shape == (8, 5, 4, 6, 8) and batch["text_emb"].shape == (8, 512, 16)
  args = ["--config=configs/tiny.py", *(f"--config.{k}={v}" for k, v in records.items()),
          "--config.data.data_dir=nowhere", "--config.model.dim=64", "--config.model.num_heads=2",
          "--config.model.num_layers=2", "--config.model.ffn_dim=64", "--config.train.sample_every=0",
          "--config.train.gain_every=0", "--config.mesh.data=2", "--config.mesh.fsdp=2",
          f"--workdir={tmp_path / 'run'}"]
  for what in ("train", "sample"):
    assert cli([*args, f"--compile_only={what}", "--topology=v5e:2x2", "--frame_size=64x96"]) == 0
    assert "-> fits" in capsys.readouterr().out and not (tmp_path / "run").exists()
  for extra, words in ((["--frame_size=64x96"], "only with --compile_only"),
                       (["--compile_only=train", "--topology=v5e:2x2", "--frame_size=64x90"], "multiples of 16"),
                       (["--compile_only=train", "--topology=v5e:2x2"], "--frame_size HxW")):
    assert cli([*args, *extra]) == 2
    assert words in capsys.readouterr().err, extra


def test_kernels_run_per_batch_shard_under_a_mesh():
  """``batch_axes``: the kernels (interpreted on CPU) split over a 2x2 mesh equal the references."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxwm.training.sharding import make_mesh  # pylint: disable=g-import-not-at-top
  mesh = make_mesh(2, 2, jax.devices()[:4])
  axes = ("data", "fsdp")
  put = lambda x: jax.device_put(x, NamedSharding(mesh, P(axes)))  # pylint: disable=unnecessary-lambda-assignment
  ks = jax.random.split(jax.random.key(0), 8)
  n, f = 4, 3
  q, k, v = (put(jax.random.normal(kk, (4, f * n, 2, 8))) for kk in ks[:3])
  idx = put(jnp.asarray(np.tile([[[0, -1], [1, 0], [2, 1]]], (4, 1, 1)), jnp.int32))
  x = [put(jax.random.normal(kk, (4, 16, 2, 8))) for kk in ks[3:6]]
  g = put(-jnp.abs(jax.random.normal(ks[6], (4, 16, 2, 8))))
  beta = put(jax.nn.sigmoid(jax.random.normal(ks[7], (4, 16, 2))))
  with jax.set_mesh(mesh):
    for impl in ("pallas_tpu", "pallas_gpu"):  # XLA cannot partition a Pallas call: it must run per shard
      traced = jax.make_jaxpr(lambda *a, impl=impl: kernels.gathered_attention(
          *a, tokens_per_frame=n, impl=impl, interpret=True, batch_axes=axes))(q, k, v, idx)
      assert "shard_map" in str(traced), impl
    # Executed with the GPU kernels' interpreter (plain JAX); the TPU interpreter synchronises devices
    # through host callbacks, which can starve on a 2-core host with 4 fake devices.
    got = jax.jit(lambda *a: kernels.gathered_attention(
        *a, tokens_per_frame=n, impl="pallas_gpu", interpret=True, batch_axes=axes))(q, k, v, idx)
    want = kernels.gathered_attention(q, k, v, idx, tokens_per_frame=n)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    o, s = jax.jit(lambda *a: kernels.delta_rule_chunked(
        *a, chunk_size=8, impl="pallas_gpu", interpret=True, output_final_state=True, batch_axes=axes))(*x, g, beta)
    o_ref, s_ref = kernels.delta_rule_chunked(*x, g, beta, chunk_size=8, output_final_state=True)
    np.testing.assert_allclose(np.asarray(o), np.asarray(o_ref), atol=1e-4)
    np.testing.assert_allclose(np.asarray(s), np.asarray(s_ref), atol=1e-4)


def test_analytic_flops_match_xla_on_an_unrolled_forward():
  """With the layer scan unrolled XLA's cost analysis counts every layer: the analytic count agrees
  (within the elementwise work it leaves out)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import CameraConfig, ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.init import init_frames, init_params  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.training.compile_only import model_flops  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig(dim=128, num_heads=2, num_layers=3, ffn_dim=512, in_channels=12, out_channels=12,
                    camera=CameraConfig(encoding="rope3d"), scan_unroll=3,
                    attention_impl="xla_lse")  # XLA counts no FLOP inside the C++ kernel (cpu_flash)
  model = WanModel(cfg)
  shape = (1, 6, 8, 8, 12)  # 16 tokens per frame, 96 tokens
  params = jax.eval_shape(lambda k: nn.unbox(init_params(model, k, shape, 16)), jax.random.key(0))
  fwd = jax.jit(lambda p, x: model.apply({"params": p}, x, jnp.zeros(shape[:2]), init_frames(shape, 16))[0])
  cost = fwd.lower(params, jax.ShapeDtypeStruct(shape, jnp.float32)).compile().cost_analysis()
  xla = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
  ours = model_flops(cfg, params, 96, 96, backward=False, frames=6)
  assert 0.85 < ours / xla < 1.05, (ours, xla)
  dense = model_flops(dataclasses.replace(cfg, remat="full"), params, 96, 96, frames=6)
  assert dense == 4 * ours  # forward, backward (2x), rematerialised forward
  # the backward under each remat policy against XLA's count of the compiled gradient (the attention is xla_lse:
  # jnp, so dots_and_kernels recomputes its forward)
  grad_flops = {}
  for remat in ("none", "dots_and_kernels", "full"):
    m = WanModel(dataclasses.replace(cfg, remat=remat))
    loss = lambda p, x, m=m: jnp.sum(m.apply({"params": p}, x, jnp.zeros(shape[:2]), init_frames(shape, 16))[0])  # pylint: disable=unnecessary-lambda-assignment
    cost = jax.jit(jax.grad(loss)).lower(params, jax.ShapeDtypeStruct(shape, jnp.float32)).compile().cost_analysis()
    grad_flops[remat] = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
    ratio = model_flops(dataclasses.replace(cfg, remat=remat), params, 96, 96, frames=6) / grad_flops[remat]
    assert 0.85 < ratio < 1.1, (remat, ratio)
  assert grad_flops["none"] < grad_flops["dots_and_kernels"] < grad_flops["full"]


def test_analytic_flops_count_the_text_side_once_per_sequence():
  """With cross-attention the text projection and the cross-attention keys/values apply to the ``context``
  tokens, not to every query token: the unrolled forward's XLA count agrees."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import CameraConfig, ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.init import init_frames, init_params  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.training.compile_only import model_flops  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig(dim=128, num_heads=2, num_layers=3, ffn_dim=512, in_channels=12, out_channels=12, text_dim=256,
                    cross_attn=True, camera=CameraConfig(encoding="rope3d"), scan_unroll=3,
                    attention_impl="xla_lse")  # XLA counts no FLOP inside the C++ kernel (cpu_flash)
  model = WanModel(cfg)
  shape, ctx = (1, 6, 8, 8, 12), jax.ShapeDtypeStruct((1, 40, 256), jnp.float32)  # 96 query tokens, 40 text tokens
  params = jax.eval_shape(lambda k: nn.unbox(init_params(model, k, shape, 16)), jax.random.key(0))
  fwd = jax.jit(lambda p, x, c: model.apply({"params": p}, x, jnp.zeros(shape[:2]), init_frames(shape, 16),
                                            context=c)[0])
  cost = fwd.lower(params, jax.ShapeDtypeStruct(shape, jnp.float32), ctx).compile().cost_analysis()
  xla = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
  ours = model_flops(cfg, params, 96, 96, context=40, backward=False, frames=6)
  assert 0.85 < ours / xla < 1.05, (ours, xla)
  # what dots_and_kernels computes twice (the jnp self- and cross-attention, xla_lse here; and the elementwise work,
  # which the analytic count leaves out): the compiled gradients' difference from remat="none", XLA's count
  import dataclasses  # pylint: disable=g-import-not-at-top
  grads, ours = {}, {}
  for remat in ("none", "dots_and_kernels"):
    m, c = WanModel(dataclasses.replace(cfg, remat=remat)), dataclasses.replace(cfg, remat=remat)
    loss = lambda p, x, t, m=m: jnp.sum(m.apply({"params": p}, x, jnp.zeros(shape[:2]), init_frames(shape, 16),  # pylint: disable=unnecessary-lambda-assignment
                                                context=t)[0])
    cost = jax.jit(jax.grad(loss)).lower(params, jax.ShapeDtypeStruct(shape, jnp.float32), ctx).compile()
    cost = cost.cost_analysis()
    grads[remat] = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
    ours[remat] = model_flops(c, params, 96, 96, context=40, frames=6)
  recomputed = grads["dots_and_kernels"] - grads["none"]
  assert 0.8 < (ours["dots_and_kernels"] - ours["none"]) / recomputed <= 1.0, (ours, grads)
