// Checking every GPU runtime call: a failure becomes a one-line mla::Error naming the call.
// (The failure path lives in gpu_check.cpp: fmt's compile-time format checks do not build under
// nvcc.)
#pragma once
#include "platform/gpu/gpu_runtime.h"

namespace mla::gpu {
// `kind` names the runtime or library ("CUDA", "HIP", "cuBLAS").
[[noreturn]] void gpu_fail(const char* kind, const char* what, const char* call, const char* file, int line);

#if defined(MLA_HIP)
inline constexpr const char* kRuntimeName = "HIP";
#else
inline constexpr const char* kRuntimeName = "CUDA";
#endif
}  // namespace mla::gpu

#define MLA_GPU_CHECK(call)                                                                      \
  do {                                                                                           \
    cudaError_t err_ = (call);                                                                   \
    if (err_ != cudaSuccess)                                                                     \
      ::mla::gpu::gpu_fail(::mla::gpu::kRuntimeName, cudaGetErrorString(err_), #call, __FILE__, __LINE__); \
  } while (0)

// After a launch: the launch itself (configuration errors) is checked at once.
#define MLA_GPU_LAUNCH_CHECK() MLA_GPU_CHECK(cudaGetLastError())
