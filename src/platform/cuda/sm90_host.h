// sm90_host.h — the host side of the Hopper (sm_90a) kernels: whether a kernel's sm_90a code runs on
// the current device, and TMA tensor maps over bf16 tensors (128-byte swizzle, the layout wgmma
// reads). One definition, shared by mha_prefill.cu and moe_gemm.cu.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace mla::cuda {

// `kernel` was built for sm_90a (binaryVersion 90) and the current device is compute capability 9.x.
bool sm90a_runs(const void* kernel);

// A tiled TMA map over a bf16 tensor of `rank` dimensions (innermost first): dims in elements,
// strides in bytes of dimensions 1 .. rank−1, box in elements (box[0] · 2 ≤ 128 bytes), 128-byte
// swizzle, out-of-bounds elements zero-filled. Throws a one-line error if the driver rejects it.
CUtensorMap bf16_tensor_map(void* ptr, int rank, const uint64_t* dims, const uint64_t* strides, const uint32_t* box);

}  // namespace mla::cuda
