// Checking cuBLAS calls (CUDA runtime calls use MLA_GPU_CHECK of platform/gpu/gpu_check.h).
#pragma once
#include <cublas_v2.h>

#include "platform/gpu/gpu_check.h"

#define MLA_CUDA_CHECK(call) MLA_GPU_CHECK(call)
#define MLA_CUDA_LAUNCH_CHECK() MLA_GPU_LAUNCH_CHECK()

#define MLA_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                         \
    cublasStatus_t st_ = (call);                                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
      ::mla::gpu::gpu_fail("cuBLAS", cublasGetStatusString(st_), #call, __FILE__, __LINE__);   \
  } while (0)
