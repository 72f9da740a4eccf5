"""``benchmarks/profile_step.py``'s attribution of XLA instructions to model components (what BENCHMARKS.md's
profiles rest on): an instruction whose tuple shape has more than five elements is indexed, a C++ kernel under an
attention layer is attention, WorldRoPE's named factors are camera work, and only the transpose primitive is layout
(every backward op's name starts with ``transpose(jvp(...))``)."""

import importlib.util
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def profile_step():
  """The module, with ``benchmarks/`` on ``sys.path`` for its sibling imports while this file's tests run only
  (left there, a benchmark named as a standard library module would shadow it)."""
  saved = list(sys.path)
  sys.path.insert(0, str(BENCH))
  try:
    spec = importlib.util.spec_from_file_location("profile_step", BENCH / "profile_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
  finally:
    sys.path[:] = saved


def test_a_long_tuple_custom_call_is_indexed(profile_step):
  text = ('  %ffi_call.28 = (f32[4,576,4,48]{3,2,1,0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, /*index=5*/'
          'f32[4]{0}) custom-call(%a, %b), custom_call_target="jaxwm_cpu_attention_bwd", metadata={op_name='
          '"jit(step)/transpose(jvp(WanModel))/while/body/closed_call/blocks/attn1/ffi_call"}\n'
          '  %add.1 = f32[4]{0} add(%a, %b), metadata={op_name="jit(step)/jvp(WanModel)/blocks/add"}\n')
  index = profile_step._hlo_index(text)  # pylint: disable=protected-access
  assert index["ffi_call.28"] == ("custom-call", "jit(step)/transpose(jvp(WanModel))/while/body/closed_call/blocks/"
                                                 "attn1/ffi_call")
  assert index["add.1"][0] == "add"


@pytest.mark.parametrize("op_name,opcode,group", [
    ("jit(step)/transpose(jvp(WanModel))/while/body/closed_call/blocks/attn1/cond/branch_0_fun/ffi_call",
     "custom-call", "attention core"),
    ("jit(step)/transpose(jvp(WanModel))/while/body/closed_call/blocks/attn1/worldrope_factors/blocks/attn1/add_any",
     "fusion", "RoPE / camera"),
    ("jit(step)/transpose(jvp(WanModel))/while/body/closed_call/blocks/add_any", "fusion", "norms + modulation"),
    ("jit(step)/transpose(jvp(WanModel))/while/body/jit(dynamic_index_in_dim)/dynamic_slice", "fusion", "other"),
    ("jit(step)/jvp(WanModel)/while/body/closed_call/blocks/attn1/...ji,...mjr->...mir/transpose", "fusion",
     "layout (copy/transpose)"),
    ("jit(step)/jvp(WanModel)/while/body/closed_call/blocks/x", "copy", "layout (copy/transpose)"),
])
def test_groups(profile_step, op_name, opcode, group):
  assert profile_step._jax_group(op_name, opcode) == group  # pylint: disable=protected-access
