// The GPU runtime shim: the shared GPU code (this folder) and the ROCm platform are written with
// CUDA's names; a HIP build (MLA_HIP, set by the ROCm build) maps them to HIP's. Nothing else in
// the shared code knows which runtime it is built for.
#pragma once
#include <cstdint>
#include <type_traits>

#if defined(MLA_HIP)
#include <hip/hip_runtime.h>

#define cudaStream_t hipStream_t
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemset hipMemset
#define cudaMallocAsync hipMallocAsync
#define cudaFreeAsync hipFreeAsync
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventQuery hipEventQuery
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventDestroy hipEventDestroy
#define cudaEventCreate hipEventCreate
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaErrorNotReady hipErrorNotReady
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#else
#include <cuda_runtime.h>
#endif

namespace mla::gpu {

// Whether a pointer is 16-byte aligned (the vector paths' 16-byte loads and cp.async need it).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// What a stream handle points to (CUstream_st on CUDA, ihipStream_t on HIP).
using StreamObject = std::remove_pointer_t<cudaStream_t>;

#if defined(__CUDACC__) || defined(__HIPCC__)
// Butterfly exchange within groups of 32 lanes. The shared kernels reduce over 32-lane groups, which
// is one warp on NVIDIA and half a wavefront on AMD (wave64): xor offsets below 32 never cross it.
__device__ __forceinline__ float shfl_xor(float v, int offset) {
#if defined(MLA_HIP)
  return __shfl_xor(v, offset);
#else
  return __shfl_xor_sync(0xffffffffu, v, offset);
#endif
}
#endif

}  // namespace mla::gpu
