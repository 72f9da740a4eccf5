// XLA FFI binding helpers shared by the C++ kernels (xla_kernels/*.cc). A binding cannot be copied or moved from
// outside the FFI: each step calls a member on the previous one, taken by reference.
#pragma once
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jaxwm_ffi {
namespace ffi = xla::ffi;

// `binding` with N >= 1 more float32 buffer arguments.
template <int N, typename B>
auto f32_args(B&& binding) {
  static_assert(N >= 1);
  if constexpr (N == 1) {
    return std::move(binding).template Arg<ffi::Buffer<ffi::F32>>();
  } else {
    return f32_args<N - 1>(std::move(binding).template Arg<ffi::Buffer<ffi::F32>>());
  }
}

// `binding` with N >= 1 more float32 buffer results.
template <int N, typename B>
auto f32_rets(B&& binding) {
  static_assert(N >= 1);
  if constexpr (N == 1) {
    return std::move(binding).template Ret<ffi::Buffer<ffi::F32>>();
  } else {
    return f32_rets<N - 1>(std::move(binding).template Ret<ffi::Buffer<ffi::F32>>());
  }
}
}  // namespace jaxwm_ffi
