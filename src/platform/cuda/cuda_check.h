// Checking every CUDA and cuBLAS call: a failure becomes a one-line mla::Error naming the call.
// (The failure path lives in a .cpp: fmt's compile-time format checks do not build under nvcc.)
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace mla::cuda {
[[noreturn]] void cuda_fail(const char* kind, const char* what, const char* call, const char* file,
                            int line);
}

#define MLA_CUDA_CHECK(call)                                                                   \
  do {                                                                                         \
    cudaError_t err_ = (call);                                                                 \
    if (err_ != cudaSuccess)                                                                   \
      ::mla::cuda::cuda_fail("CUDA", cudaGetErrorString(err_), #call, __FILE__, __LINE__);     \
  } while (0)

#define MLA_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                         \
    cublasStatus_t st_ = (call);                                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
      ::mla::cuda::cuda_fail("cuBLAS", cublasGetStatusString(st_), #call, __FILE__, __LINE__); \
  } while (0)

// After a launch: the launch itself (configuration errors) is checked at once.
#define MLA_CUDA_LAUNCH_CHECK() MLA_CUDA_CHECK(cudaGetLastError())
