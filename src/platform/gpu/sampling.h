// sampling.h — the launcher of Ops::sample_rows on the GPU (sampling.cu, CUDA and HIP): one block
// per row draws the token of mla/sampling.h's rule without sorting the vocabulary.
#pragma once
#include <cstdint>

#include "platform/gpu/gpu_runtime.h"

namespace mla::gpu {

// Per-row parameters on the device: kSampleParams doubles per row.
inline constexpr int kSampleParams = 5;  // temperature, top_p, min_p, u, top_k

// x[R, V] f32, params[R, kSampleParams] f64 (device) → out[R] i32.
void sample_rows(const float* x, int64_t R, int64_t V, const double* params, int32_t* out, cudaStream_t s);

}  // namespace mla::gpu
