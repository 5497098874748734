// sm90_host.cpp — see sm90_host.h.
#include "platform/cuda/sm90_host.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "platform/gpu/gpu_check.h"

namespace mla::cuda {
namespace {

using EncodeFn = PFN_cuTensorMapEncodeTiled_v12000;
EncodeFn tensor_map_encoder() {
  static const EncodeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult qr{};
    MLA_GPU_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &qr));
    if (qr != cudaDriverEntryPointSuccess || f == nullptr)
      gpu::gpu_fail("CUDA", "driver entry point not found", "cuTensorMapEncodeTiled", __FILE__, __LINE__);
    return reinterpret_cast<EncodeFn>(f);
  }();
  return fn;
}

}  // namespace

int device_sms() {
  static int cache[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return 132;
  if (cache[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cache[dev] = n;
  }
  return cache[dev];
}

bool sm90a_runs(const void* kernel) {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && a.binaryVersion == 90;
}

void expect_register_pool(const void* kernel, const char* name, int threads, int budget) {
  cudaFuncAttributes a{};
  MLA_GPU_CHECK(cudaFuncGetAttributes(&a, kernel));
  if (a.numRegs * threads < budget) {
    const std::string what = std::string(name) + " holds " + std::to_string(a.numRegs) + " registers a thread, " +
                             std::to_string(a.numRegs * threads) + " a block: its setmaxnreg budgets need " +
                             std::to_string(budget) + " and would wait forever";
    gpu::gpu_fail("CUDA", what.c_str(), "setmaxnreg", __FILE__, __LINE__);
  }
}

CUtensorMap bf16_tensor_map(void* ptr, int rank, const uint64_t* dims, const uint64_t* strides, const uint32_t* box) {
  CUtensorMap m;
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], e[5];
  for (int i = 0; i < rank; ++i) d[i] = dims[i], b[i] = box[i], e[i] = 1;
  for (int i = 0; i + 1 < rank; ++i) s[i] = strides[i];
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, cuuint32_t(rank), ptr, d, s, b, e,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) gpu::gpu_fail("CUDA driver", "tensor map rejected", "cuTensorMapEncodeTiled", __FILE__, __LINE__);
  return m;
}

}  // namespace mla::cuda
