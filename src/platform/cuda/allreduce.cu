// Our all-reduce kernels over peer memory: the per-block barrier, one-shot, two-shot, and the
// one-shot reduce fused with add + RMSNorm (allreduce.h says how the pieces fit).
#include "platform/cuda/allreduce.h"

#include "mla/fp_formats.h"
#include "platform/gpu/elem.cuh"
#include "platform/gpu/elementwise.h"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/norm.cuh"

namespace mla::cuda {
namespace {

using gpu::load_elem;
using gpu::store_elem;

// The flags of a region, in 64-bit words: epoch[kArBlocks][kArMaxRanks], then
// tag[kArBlocks][2][kArMaxRanks] (by the parity of the epoch it goes with).
__device__ __forceinline__ uint64_t* epoch_slot(char* region, int block, int src) {
  return reinterpret_cast<uint64_t*>(region) + block * kArMaxRanks + src;
}
__device__ __forceinline__ uint64_t* tag_slot(char* region, int block, uint64_t epoch, int src) {
  return reinterpret_cast<uint64_t*>(region) + kArBlocks * kArMaxRanks + (block * 2 + int(epoch & 1)) * kArMaxRanks + src;
}
static_assert(size_t(kArBlocks) * kArMaxRanks * 3 * 8 <= kArFlagBytes, "flags overflow their space");

__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile(uint64_t* p, uint64_t v) { *reinterpret_cast<volatile uint64_t*>(p) = v; }
__device__ __forceinline__ uint64_t ld_volatile(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void record_error(const ArPeers& p, int code, int peer, uint64_t mine, uint64_t theirs) {
  volatile ArError* e = p.error;
  e->peer = peer;
  e->mine = mine;
  e->theirs = theirs;
  __threadfence_system();
  e->code = code;
  __threadfence_system();
}

// One block's view of a call: its epoch (barriers so far) and the half of the data it uses.
struct Block {
  uint64_t epoch;
  uint64_t call;
  int bad;  // 0, or the ArError code that stopped this call
  int bad_peer;
  uint64_t bad_tag;
};

// Loads this block's counters; `data` says whether the call takes a data half (parity of calls).
__device__ void begin(const ArPeers& p, Block& s, bool data) {
  if (threadIdx.x == 0) {
    uint64_t* st = p.state;
    s.epoch = st[blockIdx.x];
    s.call = st[kArBlocks + blockIdx.x];
    if (data) st[kArBlocks + blockIdx.x] = s.call + 1;
    s.bad = 0;
    s.bad_peer = kArMaxRanks;
  }
  __syncthreads();
}
__device__ void end(const ArPeers& p, Block& s) {
  __syncthreads();
  if (threadIdx.x == 0) p.state[blockIdx.x] = s.epoch;
}

// Block b of every rank meets here. Returns false (on every thread) when a peer's tag differs or a
// peer did not come in time; the first thread of block 0 records it.
__device__ bool barrier(const ArPeers& p, Block& s, uint64_t tag) {
  __syncthreads();  // this block's writes before the signal
  const uint64_t e = s.epoch + 1;
  const int t = threadIdx.x, b = blockIdx.x;
  if (t < p.size && t != p.rank) {
    st_volatile(tag_slot(p.region[t], b, e, p.rank), tag);
    st_release_sys(epoch_slot(p.region[t], b, p.rank), e);  // orders the tag and this block's data
    const uint64_t* mine = epoch_slot(p.region[p.rank], b, t);
    const uint64_t t0 = global_ns();
    bool late = false;
    while (ld_acquire_sys(mine) < e) {
      if (global_ns() - t0 > p.timeout_ns) {
        late = true;
        break;
      }
    }
    if (late) {
      atomicExch(&s.bad, 2);
      atomicMin(&s.bad_peer, t);
    } else {
      const uint64_t theirs = ld_volatile(tag_slot(p.region[p.rank], b, e, t));
      if (theirs != tag) {
        atomicCAS(&s.bad, 0, 1);
        if (atomicMin(&s.bad_peer, t) > t) s.bad_tag = theirs;  // racy only between differing peers
      }
    }
  }
  __syncthreads();
  const int bad = s.bad;
  if (t == 0) {
    s.epoch = e;
    if (bad == 2 || (bad == 1 && b == 0)) record_error(p, bad, s.bad_peer, tag, bad == 1 ? s.bad_tag : 0);
  }
  return bad == 0;
}

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<uint16_t>(uint16_t v) { return fp::bf16_decode(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ uint16_t from_f32<uint16_t>(float v) { return fp::bf16_encode(v); }

// The work is cut in units of 16 bytes (4 f32 or 8 bf16), the last one possibly partial; which block
// takes which unit never depends on alignment, so ranks whose tensors differ in alignment still
// pair up. kVec: one 16-byte access (aligned, whole units); else element by element.
template <typename T>
struct alignas(16) Unit {
  static constexpr int V = 16 / int(sizeof(T));
  T v[V];
};
template <typename T, bool kVec>
__device__ __forceinline__ Unit<T> load_unit(const T* base, int64_t u, int64_t n) {
  if constexpr (kVec) {
    return reinterpret_cast<const Unit<T>*>(base)[u];
  } else {
    Unit<T> a;
#pragma unroll
    for (int k = 0; k < Unit<T>::V; ++k) {
      const int64_t i = u * Unit<T>::V + k;
      a.v[k] = i < n ? base[i] : T(0);
    }
    return a;
  }
}
template <typename T, bool kVec>
__device__ __forceinline__ void store_unit(T* base, int64_t u, int64_t n, const Unit<T>& a) {
  if constexpr (kVec) {
    reinterpret_cast<Unit<T>*>(base)[u] = a;
  } else {
#pragma unroll
    for (int k = 0; k < Unit<T>::V; ++k) {
      const int64_t i = u * Unit<T>::V + k;
      if (i < n) base[i] = a.v[k];
    }
  }
}

// Σ_r in[r] in f32, rank order, rounded once.
template <int N, typename T>
__device__ __forceinline__ Unit<T> sum_units(const Unit<T> (&in)[N]) {
  Unit<T> out;
#pragma unroll
  for (int k = 0; k < Unit<T>::V; ++k) {
    float acc = to_f32<T>(in[0].v[k]);
#pragma unroll
    for (int r = 1; r < N; ++r) acc += to_f32<T>(in[r].v[k]);
    out.v[k] = from_f32<T>(acc);
  }
  return out;
}

// Units this thread handles, `batch` at a time with every load of a batch issued before any store
// (peer loads are slow; the loop's stores would otherwise keep the next loads waiting).
template <int N>
constexpr int batch_of() {
  return N <= 2 ? 4 : N <= 4 ? 2 : 1;
}

// dst[u] = src[u] for this thread's units u of [begin, end) (in-block index j = u − begin).
template <typename T, bool kVec, int B>
__device__ __forceinline__ void copy_units(const T* src, T* dst, int64_t begin, int64_t end, int64_t n, int64_t first,
                                           int64_t step) {
  for (int64_t j0 = begin + first; j0 < end; j0 += step * B) {
    Unit<T> a[B];
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (j0 + k * step < end) a[k] = load_unit<T, kVec>(src, j0 + k * step, n);
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (j0 + k * step < end) store_unit<T, kVec>(dst, j0 + k * step, n, a[k]);
  }
}

// For this thread's units u of [begin, end): v = Σ_r peer r's u (f32, rank order); out[u] = v, and
// out2[u] = v when out2 is given.
template <int N, typename T, bool kVec, int B>
__device__ __forceinline__ void reduce_units(char* const* src, T* out, T* out2, int64_t begin, int64_t end, int64_t n,
                                             int64_t first, int64_t step) {
  for (int64_t j0 = begin + first; j0 < end; j0 += step * B) {
    Unit<T> a[B][N];
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (j0 + k * step < end) {
#pragma unroll
        for (int r = 0; r < N; ++r) a[k][r] = reinterpret_cast<const Unit<T>*>(src[r])[j0 + k * step];
      }
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (j0 + k * step < end) {
        const Unit<T> v = sum_units<N, T>(a[k]);
        store_unit<T, kVec>(out, j0 + k * step, n, v);
        if (out2) reinterpret_cast<Unit<T>*>(out2)[j0 + k * step] = v;
      }
  }
}

// The peers' data halves of this call: src[r] = rank r's.
template <int N>
__device__ __forceinline__ void halves(const ArPeers& p, const Block& s, char* (&src)[N]) {
  const size_t half = kArFlagBytes + (s.call & 1) * p.half_bytes;
#pragma unroll
  for (int r = 0; r < N; ++r) src[r] = p.region[r] + half;
}

template <int N, typename T, bool kVec>
__global__ void __launch_bounds__(kArThreads) one_shot_k(ArPeers p, T* x, int64_t n, uint64_t tag) {
  constexpr int B = batch_of<N>();
  __shared__ Block s;
  begin(p, s, true);
  char* src[N];
  halves<N>(p, s, src);
  const int64_t units = (n + Unit<T>::V - 1) / Unit<T>::V;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(kArBlocks) * blockDim.x;
  copy_units<T, kVec, B>(x, reinterpret_cast<T*>(src[p.rank]), 0, units, n, first, step);
  if (barrier(p, s, tag)) reduce_units<N, T, kVec, B>(src, x, nullptr, 0, units, n, first, step);
  end(p, s);
}

// The units split into N slices of `per` units (the last ones shorter or empty): rank q reduces
// slice q. Block b handles the same positions j of every slice in every phase.
template <int N, typename T, bool kVec>
__global__ void __launch_bounds__(kArThreads) two_shot_k(ArPeers p, T* x, int64_t n, uint64_t tag) {
  constexpr int B = batch_of<N>();
  __shared__ Block s;
  begin(p, s, true);
  char* src[N];
  halves<N>(p, s, src);
  T* mine = reinterpret_cast<T*>(src[p.rank]);
  const int64_t units = (n + Unit<T>::V - 1) / Unit<T>::V, per = (units + N - 1) / N;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(kArBlocks) * blockDim.x;
  auto lo = [&](int q) { return min(units, q * per); };
  auto hi = [&](int q) { return min(units, (q + 1) * per); };
#pragma unroll
  for (int q = 0; q < N; ++q) copy_units<T, kVec, B>(x, mine, lo(q), hi(q), n, first, step);
  if (barrier(p, s, tag)) {
    reduce_units<N, T, kVec, B>(src, x, mine, lo(p.rank), hi(p.rank), n, first, step);
    if (barrier(p, s, tag))
#pragma unroll
      for (int q = 0; q < N; ++q)
        if (q != p.rank) copy_units<T, kVec, B>(reinterpret_cast<const T*>(src[q]), x, lo(q), hi(q), n, first, step);
  }
  end(p, s);
}

// The push flavours: a rank writes its data into the peers' buffers (NVLink writes, which need no
// round trip) and reads only its own buffer after the barrier.
//
// One-shot push: rank r writes its units into slot r of every rank's half (slots of `units` units);
// after the barrier each rank sums its own slots in rank order.
template <int N, typename T, bool kVec>
__global__ void __launch_bounds__(kArThreads) one_shot_push_k(ArPeers p, T* x, int64_t n, uint64_t tag) {
  constexpr int B = batch_of<N>();
  __shared__ Block s;
  begin(p, s, true);
  char* dst[N];
  halves<N>(p, s, dst);
  const int64_t units = (n + Unit<T>::V - 1) / Unit<T>::V;
  const size_t slot = size_t(units) * sizeof(Unit<T>);
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(kArBlocks) * blockDim.x;
  for (int64_t j0 = first; j0 < units; j0 += step * B) {
    Unit<T> a[B];
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (j0 + k * step < units) a[k] = load_unit<T, kVec>(x, j0 + k * step, n);
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (j0 + k * step < units)
#pragma unroll
        for (int q = 0; q < N; ++q) reinterpret_cast<Unit<T>*>(dst[q] + p.rank * slot)[j0 + k * step] = a[k];
  }
  if (barrier(p, s, tag)) {
    char* src[N];
#pragma unroll
    for (int r = 0; r < N; ++r) src[r] = dst[p.rank] + r * slot;
    reduce_units<N, T, kVec, B>(src, x, nullptr, 0, units, n, first, step);
  }
  end(p, s);
}

// Two-shot push: the units in N slices of `per`; rank r writes its slice q into slot r of rank q's
// half; after the barrier rank q sums its slots (its slice, rank order) and writes the sum into
// gathered slice q of every rank's half; after the second barrier each rank copies the gathered
// slices out. A half holds N slots and N gathered slices of `per` units.
template <int N, typename T, bool kVec>
__global__ void __launch_bounds__(kArThreads) two_shot_push_k(ArPeers p, T* x, int64_t n, uint64_t tag) {
  constexpr int B = batch_of<N>();
  constexpr int V = Unit<T>::V;
  using U = Unit<T>;
  __shared__ Block s;
  begin(p, s, true);
  char* half[N];
  halves<N>(p, s, half);
  const int64_t units = (n + V - 1) / V, per = (units + N - 1) / N;
  const size_t slot = size_t(per) * sizeof(U);
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(kArBlocks) * blockDim.x;
  auto lo = [&](int q) { return min(units, q * per); };
  auto len = [&](int q) { return min(units, (q + 1) * per) - lo(q); };
  const int me = p.rank;
#pragma unroll
  for (int q = 0; q < N; ++q) {  // my slice q → slot me of rank q
    const T* from = x + lo(q) * V;
    const int64_t from_n = n - lo(q) * V, l = len(q);
    U* to = reinterpret_cast<U*>(half[q] + me * slot);
    for (int64_t j0 = first; j0 < l; j0 += step * B) {
      U a[B];
#pragma unroll
      for (int k = 0; k < B; ++k)
        if (j0 + k * step < l) a[k] = load_unit<T, kVec>(from, j0 + k * step, from_n);
#pragma unroll
      for (int k = 0; k < B; ++k)
        if (j0 + k * step < l) to[j0 + k * step] = a[k];
    }
  }
  if (barrier(p, s, tag)) {
    {  // my slice: Σ of my slots → x and every rank's gathered slice me
      T* out = x + lo(me) * V;
      const int64_t out_n = n - lo(me) * V, l = len(me);
      for (int64_t j0 = first; j0 < l; j0 += step * B) {
        U a[B][N];
#pragma unroll
        for (int k = 0; k < B; ++k)
          if (j0 + k * step < l) {
#pragma unroll
            for (int r = 0; r < N; ++r) a[k][r] = reinterpret_cast<const U*>(half[me] + r * slot)[j0 + k * step];
          }
#pragma unroll
        for (int k = 0; k < B; ++k)
          if (j0 + k * step < l) {
            const U v = sum_units<N, T>(a[k]);
            store_unit<T, kVec>(out, j0 + k * step, out_n, v);
#pragma unroll
            for (int q = 0; q < N; ++q)
              if (q != me) reinterpret_cast<U*>(half[q] + (N + me) * slot)[j0 + k * step] = v;
          }
      }
    }
    if (barrier(p, s, tag))
#pragma unroll
      for (int q = 0; q < N; ++q) {
        if (q == me) continue;
        const U* from = reinterpret_cast<const U*>(half[me] + (N + q) * slot);
        T* out = x + lo(q) * V;
        const int64_t out_n = n - lo(q) * V, l = len(q);
        for (int64_t j0 = first; j0 < l; j0 += step * B) {
          U a[B];
#pragma unroll
          for (int k = 0; k < B; ++k)
            if (j0 + k * step < l) a[k] = from[j0 + k * step];
#pragma unroll
          for (int k = 0; k < B; ++k)
            if (j0 + k * step < l) store_unit<T, kVec>(out, j0 + k * step, out_n, a[k]);
        }
      }
  }
  end(p, s);
}

// Block b takes rows b, b + kArBlocks, …. After the barrier, per row: the sum of the peers' y, h += y
// and x = h for the whole row (any thread, 16-byte units), then RMSNorm exactly as gpu::add_rmsnorm
// does it (256 threads, the same elements of the row on the same thread, the same variant: vec_norm
// from gpu::norm_rows_vectorized; the same bits).
template <int N, typename TY, bool kVec>
__global__ void __launch_bounds__(kArNormThreads)
    add_rmsnorm_k(ArPeers p, TY* y, void* h, Elem he, void* x, int64_t M, int64_t n, const void* w, Elem we,
                  float eps, bool vec_norm, uint64_t tag) {
  constexpr int B = batch_of<N>();
  constexpr int V = Unit<TY>::V;
  __shared__ Block s;
  begin(p, s, true);
  char* src[N];
  halves<N>(p, s, src);
  const int64_t row_units = (n + V - 1) / V;
  for (int64_t m = blockIdx.x; m < M; m += kArBlocks)
    copy_units<TY, kVec, B>(y + m * n, reinterpret_cast<TY*>(src[p.rank]) + m * n, 0, row_units, n, threadIdx.x,
                            blockDim.x);
  if (barrier(p, s, tag))
    for (int64_t m = blockIdx.x; m < M; m += kArBlocks) {
      char* row_src[N];
#pragma unroll
      for (int r = 0; r < N; ++r) row_src[r] = src[r] + size_t(m * n) * sizeof(TY);
      for (int64_t j0 = threadIdx.x; j0 < row_units; j0 += int64_t(blockDim.x) * B) {
        Unit<TY> a[B][N];
#pragma unroll
        for (int k = 0; k < B; ++k)
          if (j0 + k * blockDim.x < row_units) {
#pragma unroll
            for (int r = 0; r < N; ++r)
              a[k][r] = load_unit<TY, kVec>(reinterpret_cast<const TY*>(row_src[r]), j0 + k * blockDim.x, n);
          }
#pragma unroll
        for (int k = 0; k < B; ++k) {
          const int64_t u = j0 + k * blockDim.x;
          if (u >= row_units) continue;
          const Unit<TY> v = sum_units<N, TY>(a[k]);
          store_unit<TY, kVec>(y + m * n, u, n, v);
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const int64_t i = u * V + e;
            if (i >= n) break;
            const size_t at = size_t(m * n + i);
            store_elem(h, he, at, load_elem(h, he, at) + to_f32<TY>(v.v[e]));
            store_elem(x, he, at, load_elem(h, he, at));
          }
        }
      }
      __syncthreads();  // the whole row of x before the norm reads it
      gpu::rmsnorm_row_as_launched(x, he, size_t(m * n), n, w, we, eps, vec_norm);
      __syncthreads();  // the norm's shared partial sums are free again
    }
  end(p, s);
}

__global__ void check_k(ArPeers p, uint64_t tag) {
  __shared__ Block s;
  begin(p, s, false);
  const bool ok = barrier(p, s, tag);
  end(p, s);
  if (!ok) __trap();
}

template <int N, typename T>
void launch(bool two, bool push, const ArPeers& p, void* x, int64_t n, uint64_t tag, cudaStream_t st) {
  auto* px = static_cast<T*>(x);
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && (size_t(n) * sizeof(T)) % 16 == 0;
  if (push && two) {
    if (vec) two_shot_push_k<N, T, true><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
    else two_shot_push_k<N, T, false><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
  } else if (push) {
    if (vec) one_shot_push_k<N, T, true><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
    else one_shot_push_k<N, T, false><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
  } else if (two) {
    if (vec) two_shot_k<N, T, true><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
    else two_shot_k<N, T, false><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
  } else {
    if (vec) one_shot_k<N, T, true><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
    else one_shot_k<N, T, false><<<kArBlocks, kArThreads, 0, st>>>(p, px, n, tag);
  }
}

template <int N>
void launch_typed(bool two, bool push, const ArPeers& p, void* x, Elem e, int64_t n, uint64_t tag, cudaStream_t st) {
  if (e == Elem::F32) launch<N, float>(two, push, p, x, n, tag, st);
  else launch<N, uint16_t>(two, push, p, x, n, tag, st);
}

template <int N, typename TY>
void launch_fused(const ArPeers& p, void* y, void* h, Elem he, void* x, int64_t M, int64_t n, const void* w, Elem we,
                  float eps, uint64_t tag, cudaStream_t st) {
  const bool vec = reinterpret_cast<uintptr_t>(y) % 16 == 0 && (size_t(n) * sizeof(TY)) % 16 == 0;
  const bool vec_norm = gpu::norm_rows_vectorized(x, he, n, n);
  auto* py = static_cast<TY*>(y);
  if (vec)
    add_rmsnorm_k<N, TY, true><<<kArBlocks, kArNormThreads, 0, st>>>(p, py, h, he, x, M, n, w, we, eps, vec_norm, tag);
  else
    add_rmsnorm_k<N, TY, false><<<kArBlocks, kArNormThreads, 0, st>>>(p, py, h, he, x, M, n, w, we, eps, vec_norm, tag);
}

// Calls f.template operator()<N>() for the group size (2 … kArMaxRanks).
template <typename F>
void by_size(int n, F&& f) {
  switch (n) {
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 7: f.template operator()<7>(); break;
    case 8: f.template operator()<8>(); break;
    default: break;  // the communicator never calls with another size
  }
}
static_assert(kArMaxRanks == 8, "by_size covers 2 … 8 ranks");

}  // namespace

void ar_one_shot(const ArPeers& p, void* x, Elem e, int64_t n, bool push, uint64_t tag, cudaStream_t s) {
  by_size(p.size, [&]<int N>() { launch_typed<N>(false, push, p, x, e, n, tag, s); });
  MLA_GPU_LAUNCH_CHECK();
}
void ar_two_shot(const ArPeers& p, void* x, Elem e, int64_t n, bool push, uint64_t tag, cudaStream_t s) {
  by_size(p.size, [&]<int N>() { launch_typed<N>(true, push, p, x, e, n, tag, s); });
  MLA_GPU_LAUNCH_CHECK();
}
void ar_add_rmsnorm(const ArPeers& p, void* y, Elem ye, void* h, Elem he, void* x, int64_t M, int64_t n,
                    const void* w, Elem we, float eps, uint64_t tag, cudaStream_t s) {
  by_size(p.size, [&]<int N>() {
    if (ye == Elem::F32) launch_fused<N, float>(p, y, h, he, x, M, n, w, we, eps, tag, s);
    else launch_fused<N, uint16_t>(p, y, h, he, x, M, n, w, we, eps, tag, s);
  });
  MLA_GPU_LAUNCH_CHECK();
}
void ar_check(const ArPeers& p, uint64_t tag, cudaStream_t s) {
  check_k<<<1, 32, 0, s>>>(p, tag);
  MLA_GPU_LAUNCH_CHECK();
}

}  // namespace mla::cuda
