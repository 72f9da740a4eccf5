"""``benchmarks/gpu_check.py``'s Wan2.2-TI2V-5B rows (``benchmarks/gpu_5b.py``) without a GPU: the full-size training
step lowers for CUDA, both frameworks' steps run at the smoke width and build models of the same size, and GPU
names map to their peaks."""

import argparse
import importlib.util
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
  spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.fixture(scope="module")
def gpu_5b():
  """The module, with ``benchmarks/`` on ``sys.path`` for its sibling imports while this file's tests run only:
  left there, a benchmark named as a standard library module would shadow it in subprocesses (as
  ``benchmarks/encodings.py`` did until it became ``encoding_speed.py``)."""
  saved = list(sys.path)
  sys.path.insert(0, str(BENCH))
  try:
    yield _load("gpu_5b")
  finally:
    sys.path[:] = saved


def _args(mod, *argv):
  p = argparse.ArgumentParser()
  mod.add_args(p)
  p.add_argument("--smoke", action="store_true")
  p.add_argument("--lower", action="store_true")
  a = p.parse_args(list(argv))
  mod.resolve(a, p.error)
  return a


def test_both_training_steps_run_at_the_smoke_width(gpu_5b):
  a = _args(gpu_5b, "--smoke", "--train-frames", "2", "--train-repeats", "1")
  assert a.attention_impl == "xla_lse"
  jx, tc = gpu_5b.train_jax(a), gpu_5b.train_torch(a)
  tokens = 2 * 4 * 6 // 4  # 2 frames of 4x6 latents, patch 2x2
  for r in (jx, tc):
    assert r["tokens"] == tokens and r["s"] > 0 and r["flops"] > 0


def test_both_frameworks_build_the_same_backbone(gpu_5b):
  """diffusers' model (an independent implementation) has as many parameters as jaxwm's, at the smoke width and
  at the full 5B shape (built on torch's meta device: nothing allocated)."""
  import jax  # pylint: disable=g-import-not-at-top
  from diffusers import WanTransformer3DModel  # pylint: disable=g-import-not-at-top
  import train_step as ts  # pylint: disable=g-import-not-at-top
  for smoke in (True, False):
    m = gpu_5b.model_dict(smoke, "xla_lse")
    _, init, _ = ts.backbone_program(dict(m), 1, 1, (2, 2), m.in_channels, 1)
    n_jax = sum(x.size for x in jax.tree.leaves(jax.eval_shape(lambda init=init: init(jax.random.key(0)))[0]))
    step, _ = ts.torch_backbone_step(dict(m), 1, 1, (2, 2), m.in_channels, 1, device="meta")
    assert isinstance(step.model, WanTransformer3DModel)
    assert sum(p.numel() for p in step.model.parameters()) == n_jax, smoke


def test_gpu_names_map_to_their_bf16_peaks(gpu_5b):
  assert gpu_5b.peak_flops("NVIDIA H200") == 989.4e12
  assert gpu_5b.peak_flops("NVIDIA H100 PCIe") == 756e12  # before the SXM part's "H100"
  assert gpu_5b.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
  assert gpu_5b.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
  assert gpu_5b.peak_flops("Some GPU") is None


def test_without_a_gpu_the_check_exits_with_one_line():
  import subprocess  # pylint: disable=g-import-not-at-top
  out = subprocess.run([sys.executable, str(BENCH / "gpu_check.py")], capture_output=True, text=True, timeout=120,
                       check=False, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1].startswith("gpu_check: no CUDA GPU: jax's backend is 'cpu'")
  assert not out.stdout


def test_bad_5b_arguments_are_refused_naming_them(gpu_5b, capsys):
  for argv, message in ((("--stream-chunks", "2"), "--stream-chunks: 2; needs >= 3"),
                        (("--train-frames", "0"), "--train-frames: 0 is not a positive integer")):
    with pytest.raises(SystemExit):
      _args(gpu_5b, *argv)
    assert message in capsys.readouterr().err


def test_a_5b_row_past_its_timeout_becomes_an_error_row(gpu_5b, monkeypatch):
  a = _args(gpu_5b, "--smoke", "--part-timeout", "1")
  error = gpu_5b.run_part("train-jax", a)
  assert error == {"error": "timed out after 1 s (--part-timeout)"}
  monkeypatch.setattr(gpu_5b, "run_part", lambda part, a: error)
  lines = list(gpu_5b.tables(a))
  assert sum(line.endswith("| timed out after 1 s (--part-timeout) |") for line in lines) == 3  # torch, jaxwm, stream


def test_every_program_that_can_lowers_for_cuda_here(gpu_5b):
  gpu_check = _load("gpu_check")  # while gpu_5b's fixture has benchmarks/ on sys.path
  a = gpu_check.build_parser().parse_args(["--lower", "--check-frames", "3", "--tokens", "16", "--head-dim", "32",
                                           "--delta-len", "64", "--delta-heads", "2", "--delta-dim", "32"])
  gpu_5b.resolve(a, pytest.fail)
  sizes = gpu_check.lowered_for_cuda(a)  # the 5B step among them (gpu_5b.lower)
  expected = {f"{name} {impl} {label}" for name in ("frame-sparse", "delta rule") for impl in ("pallas_gpu", "xla")
              for label in ("fwd", "fwd+bwd")} | {"5B train step"}
  assert set(sizes) == expected and min(sizes.values()) > 1000


def test_the_5b_rows_model_is_wan22_ti2v_5b(gpu_5b):
  import jax  # pylint: disable=g-import-not-at-top
  import train_step as ts  # pylint: disable=g-import-not-at-top
  model = gpu_5b.model_dict(False, "xla_lse")
  _, init, _ = ts.backbone_program(dict(model), 1, 1, (2, 2), model.in_channels, 1)
  params, _ = jax.eval_shape(lambda: init(jax.random.key(0)))
  assert 4.9e9 < sum(x.size for x in jax.tree.leaves(params)) < 5.1e9  # Wan2.2-TI2V-5B's transformer
