// sm90_host.h — the host side of the Hopper (sm_90a) kernels: the current device's SM count, whether
// a kernel's sm_90a code runs on it, whether its register pool covers its setmaxnreg budgets, and
// TMA tensor maps over bf16 tensors (128-byte swizzle, the layout wgmma reads). One definition,
// shared by mha_prefill.cu, mla_decode.cpp and moe_gemm.cu.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace mla::cuda {

// Multiprocessors of the current device (asked once per device; 132 if the runtime cannot say).
int device_sms();

// `kernel` was built for sm_90a (binaryVersion 90) and the current device is compute capability 9.x.
bool sm90a_runs(const void* kernel);

// For a kernel whose warpgroups move their register budgets (setmaxnreg): its CTA starts with a
// pool of ptxas's register count × `threads`, and setmaxnreg.inc waits until the pool holds what
// it asks for, forever if it never will (a count below the budgets' sum, after an edit, hangs the
// GPU). Throws a one-line error naming `name` unless count × threads ≥ `budget` (the sum over the
// warpgroups of 128 × the count each sets). Checked once per call site.
void expect_register_pool(const void* kernel, const char* name, int threads, int budget);

// A tiled TMA map over a bf16 tensor of `rank` dimensions (innermost first): dims in elements,
// strides in bytes of dimensions 1 .. rank−1, box in elements (box[0] · 2 ≤ 128 bytes), 128-byte
// swizzle, out-of-bounds elements zero-filled. Throws a one-line error if the driver rejects it.
CUtensorMap bf16_tensor_map(void* ptr, int rank, const uint64_t* dims, const uint64_t* strides, const uint32_t* box);

}  // namespace mla::cuda
