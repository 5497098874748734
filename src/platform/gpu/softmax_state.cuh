// softmax_state.cuh — the algebra of partial attention results, one definition for every kernel
// that merges them (the split-KV combine of the CUDA MLA decode, the LSE merge of elementwise.cu,
// the online softmax of attend_row.cuh and through it the ROCm kernels) and for the host.
//
// A partial result over some keys is (o, s): o the softmax-weighted mean of their values, s the
// natural-log LSE of their scores (−inf: no key). Merging (o_a, s_a) and (o_b, s_b):
//   m = max(s_a, s_b), w = e^(s − m), o = (w_a o_a + w_b o_b) / (w_a + w_b), s = m + ln(w_a + w_b);
// an empty part (s = −inf) is the identity. SoftmaxState is the running (m, l = Σ e^(s_i − m)) of
// such a merge over any number of parts, or of an online softmax over single scores. Host and
// device, CUDA and HIP. (The tensor-core kernels keep their inner loops in log2 units with ex2.)
#pragma once
#include <cmath>

#include "mla/host_device.h"

namespace mla::gpu {

// Running max m and sum l = Σ e^(s_i − m) over the scores (or part LSEs) s_i seen so far.
struct SoftmaxState {
  float m = -INFINITY;
  float l = 0.f;

  // e^(s − m) under the current max; 0 for s = −inf (an empty part), even when m is −inf too.
  MLA_HOST_DEVICE float weight(float s) const { return s == -INFINITY ? 0.f : expf(s - m); }
  // Moves the max to m_new ≥ m; returns e^(m − m_new), the factor for whatever was accumulated
  // under the old max (0 when nothing was).
  MLA_HOST_DEVICE float rescale(float m_new) {
    const float alpha = m == -INFINITY ? 0.f : expf(m - m_new);
    l *= alpha;
    m = m_new;
    return alpha;
  }
  // The natural-log LSE of everything seen, m + ln l: −inf when nothing was (m = −inf, l = 0).
  MLA_HOST_DEVICE float lse() const { return m + logf(l); }
};

// The weights of merging two parts by LSE: o = (wa·o_a + wb·o_b) / sum, s = lse. When s_a is −inf,
// wa is 0 (and o_a may hold anything: do not read it); when s_b is −inf, (o_a, s_a) stays as it is.
struct LseMerge {
  float wa, wb, sum, lse;
};
MLA_HOST_DEVICE inline LseMerge lse_merge(float sa, float sb) {
  SoftmaxState st{fmaxf(sa, sb), 0.f};
  const float wa = st.weight(sa), wb = st.weight(sb);
  st.l = wa + wb;
  return {wa, wb, st.l, st.lse()};
}

}  // namespace mla::gpu
