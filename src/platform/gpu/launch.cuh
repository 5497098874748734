// Kernel launches with programmatic dependent launch (CUDA, sm_90): a kernel launched by
// gpu::launch may start while the stream's previous kernel ends, so its launch latency and its CTAs'
// start hide under that kernel's tail. The contract: every kernel launched by gpu::launch calls
// pdl_enter() as its first statement, in every CTA. That call waits until the previous kernel has
// completed and its writes are visible; because every CTA of every such kernel waits before it
// exits, a kernel that starts has all kernels before it complete (a CTA that returned before
// pdl_enter would break that chain). On HIP it is a plain launch and pdl_enter does nothing.
// MLA_PDL=0 in the environment launches plainly (for comparisons).
#pragma once
#include <cstddef>
#include <cstdint>

#include "platform/gpu/gpu_check.h"

namespace mla::gpu {

// False when MLA_PDL=0 (read once; gpu_check.cpp).
bool pdl_allowed();

__device__ __forceinline__ void pdl_enter() {
#if !defined(MLA_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // A grid of at most half the SMs lets the stream's next kernel start at once (its CTAs take SMs
  // this grid leaves free). A larger grid lets it start at its end: started early, the next
  // kernel's CTAs would crowd onto the few SMs such a grid leaves free and stay there.
  uint32_t sms;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  if (gridDim.x * gridDim.y * gridDim.z * 2 <= sms) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
#if defined(MLA_HIP)
  kernel<<<grid, block, smem, stream>>>(static_cast<Args&&>(args)...);
  MLA_GPU_LAUNCH_CHECK();
#else
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_allowed() ? 1 : 0;
  MLA_GPU_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...));
#endif
}

}  // namespace mla::gpu
