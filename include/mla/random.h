// mla/random.h — counter-based pseudo-random values, the same bits on the host and every GPU
// platform (a splitmix64 hash of seed and index; no state). Random weights and benchmark data.
#pragma once
#include <cstdint>

#include "mla/host_device.h"

namespace mla {

// splitmix64 of x → [0, 1) in steps of 2^-24
MLA_HOST_DEVICE inline float hash_uniform(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(x >> 40) * (1.0f / 16777216.0f);
}

// Element i of the stream `seed`: the sum of four uniforms, centred and scaled to std `scale`
// (Irwin–Hall: close to normal, bounded by ±2·√3·scale). Float arithmetic in a fixed order, so
// the host and the device give the same bits.
MLA_HOST_DEVICE inline float hash_normalish(uint64_t seed, uint64_t i, float scale) {
  const uint64_t b = seed * 0x100000001b3ull + i * 4;
  const float v = hash_uniform(b) + hash_uniform(b + 1) + hash_uniform(b + 2) + hash_uniform(b + 3) - 2.0f;
  return v * 1.7320508f * scale;
}

}  // namespace mla
