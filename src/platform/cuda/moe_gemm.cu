// moe_gemm.cu — grouped expert GEMMs on tensor cores (bf16 in, f32 accumulate): a block takes one
// row tile of one expert (platform/gpu/moe.h's plan) and a slice of output columns. Two bodies:
//   moe_gemm_k  — 16-, 32- or 64-row tiles, 64 columns: a 4-stage cp.async pipeline (64-wide reduction
//                 steps, 128B-swizzled shared memory, ldmatrix, mma.sync m16n8k16); decode sizes.
//   moe_wgmma_k — sm_90a, 128-row tiles (prefill), one persistent block an SM: a producer warpgroup
//                 gathers the activation rows with cp.async (gate/up) or brings them as one TMA box
//                 (down: a tile's rows are contiguous), and the weights with TMA, into 4 stages; two
//                 consumer warpgroups (64 rows each) run wgmma on 128 gate + 128 up or 256 down
//                 columns; a warpgroup's 64 output rows leave through shared memory (stmatrix) and
//                 TMA stores, 128 columns a round, unless some of them are past its expert's rows.
// The gate/up kernels read both projections and apply SiLU-and-multiply in their epilogue. Each
// output element sums its reduction in one fixed order (k16 steps in index order, no split-K), so
// a token's row never depends on the batch or on the body that ran it.
#include <cuda_bf16.h>

#include <algorithm>

#include "platform/cuda/moe_gemm.h"
#include "platform/cuda/sm90.cuh"
#include "platform/cuda/sm90_host.h"
#include "platform/gpu/gpu_check.h"
#include "platform/gpu/launch.cuh"

namespace mla::cuda {
namespace {

using namespace sm90;
using bf16 = __nv_bfloat16;

constexpr int kBN = 64, kBK = 64, kThreads = 128;  // 4 warps × 16 columns

// kSub: 64-wide reduction blocks a stage holds (each 128B-swizzled on its own), so a stage reads
// kSub · 128 contiguous bytes of each weight row.
template <int BM, bool kGated, int kStages, int kSub>
constexpr int smem_bytes() {
  return kStages * (BM + (kGated ? 2 : 1) * kBN) * kBK * kSub * 2;
}

// A: the activations (x by token for gate/up, h by plan row for down); W0 (and W1 = up): [E, N, Kd].
template <int BM, bool kGated, int kStages, int kSub>
__global__ void __launch_bounds__(kThreads) moe_gemm_k(const __nv_bfloat16* a, int topk, gpu::MoePlan plan,
                                                       const __nv_bfloat16* w0, const __nv_bfloat16* w1, int N, int Kd,
                                                       __nv_bfloat16* out) {
  gpu::pdl_enter();
  const int tile = blockIdx.x;
  if (tile >= *plan.num_tiles) return;
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kB = kGated ? 2 : 1;
  constexpr int kStageK = kBK * kSub;  // reduction columns a stage
  constexpr int kStageBytes = (BM + kB * kBN) * kStageK * 2;
  const uint32_t s0 = smem_u32(smem);
  const int e = plan.tiles[2 * tile], r0 = plan.tiles[2 * tile + 1];
  const int nrows = min(BM, plan.offsets[e + 1] - r0);
  const int n0 = blockIdx.y * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // This thread's A rows (at most BM·8 chunks / 128 threads of them) and their sources.
  constexpr int kRowChunks = 8 * kSub;  // 16-byte chunks of a row in a stage
  constexpr int kAChunks = BM * kRowChunks / kThreads > 0 ? BM * kRowChunks / kThreads : 1;
  const __nv_bfloat16* asrc[kAChunks];
  bool aok[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int idx = tid + i * kThreads, r = idx / kRowChunks;
    aok[i] = idx < BM * kRowChunks && r < nrows;
    const int row = aok[i] ? (kGated ? plan.rows[r0 + r] / topk : r0 + r) : 0;
    asrc[i] = a + size_t(row) * Kd + (idx % kRowChunks) * 8;
  }
  // Chunk c of row r of an operand of R rows: its 64-wide block's own swizzled tile.
  auto at = [](int R, int r, int c) { return uint32_t((c / 8) * R * 128) + swz128(r, c % 8); };
  const size_t wbase = (size_t(e) * N + n0) * Kd;
  auto load_stage = [&](int stage, int kt) {
    const uint32_t base = s0 + stage * kStageBytes;
    const int k0 = kt * kStageK;
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const int idx = tid + i * kThreads;
      if (idx < BM * kRowChunks) cp_async(base + at(BM, idx / kRowChunks, idx % kRowChunks), asrc[i] + k0, aok[i]);
    }
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const __nv_bfloat16* w = (b == 0 ? w0 : w1) + wbase + k0;
      const uint32_t bb = base + BM * kStageK * 2 + b * kBN * kStageK * 2;
#pragma unroll
      for (int i = 0; i < kBN * kRowChunks / kThreads; ++i) {
        const int idx = tid + i * kThreads, r = idx / kRowChunks, c = idx % kRowChunks;
        cp_async(bb + at(kBN, r, c), w + size_t(r) * Kd + c * 8, true);
      }
    }
  };

  constexpr int MT = BM / 16;
  float acc[kB][MT][2][4] = {};
  const int nk = Kd / kStageK;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nk) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < nk) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();
    const uint32_t base = s0 + (kt % kStages) * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kStageK / 16; ++kk) {
      const int k8 = (kk % 4) * 2;  // the k16 step's first chunk in its 64-wide block
      uint32_t af[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
        ldmatrix_x4(af[m], base + (kk / 4) * BM * 128 + swz128(m * 16 + (lane & 15), k8 + (lane >> 4)));
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        uint32_t bf[4];
        const uint32_t bb = base + BM * kStageK * 2 + b * kBN * kStageK * 2 + (kk / 4) * kBN * 128;
        ldmatrix_x4(bf, bb + swz128(warp * 16 + (lane & 7) + ((lane >> 4) << 3), k8 + ((lane >> 3) & 1)));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma_bf16(acc[b][m][0], af[m], bf[0], bf[1]);
          mma_bf16(acc[b][m][1], af[m], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: fragment c[0..1] is row lane/4, c[2..3] row lane/4 + 8; columns 2·(lane%4) + {0, 1}.
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + (lane >> 2) + half * 8;
      if (r >= nrows) continue;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float v0 = acc[0][m][nt][2 * half], v1 = acc[0][m][nt][2 * half + 1];
        if constexpr (kGated) {
          v0 = silu_mul_bf16(v0, acc[kB - 1][m][nt][2 * half]);
          v1 = silu_mul_bf16(v1, acc[kB - 1][m][nt][2 * half + 1]);
        }
        const int col = n0 + warp * 16 + nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(out + size_t(r0 + r) * N + col) = pack_bf16(v0, v1);
      }
    }
}

template <int BM, bool kGated, int kStages, int kSub>
void launch_stages(const void* a, int topk, const gpu::MoePlan& plan, int64_t max_tiles, const void* w0, const void* w1,
                   int64_t N, int64_t Kd, void* out, cudaStream_t s) {
  constexpr int smem = smem_bytes<BM, kGated, kStages, kSub>();
  static bool attr = false;  // per instantiation, once
  if (!attr) {
    MLA_GPU_CHECK(cudaFuncSetAttribute(moe_gemm_k<BM, kGated, kStages, kSub>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       smem));
    attr = true;
  }
  const dim3 grid(unsigned(max_tiles), unsigned(N / kBN));
  gpu::launch(moe_gemm_k<BM, kGated, kStages, kSub>, grid, kThreads, smem, s,
              static_cast<const __nv_bfloat16*>(a), topk, plan, static_cast<const __nv_bfloat16*>(w0),
              static_cast<const __nv_bfloat16*>(w1), int(N), int(Kd), static_cast<__nv_bfloat16*>(out));
}

// Four stages, or eight when the grid is at most two blocks an SM (decode at a few tokens: the
// weights stream through few blocks, which need more bytes in flight each); 128-wide stages, half
// as many, when the reduction is a multiple of 128 and at least 2048 (each weight row read 256
// bytes at a time: V2-Lite decode −1.3 % at b1, −2 % at b8–b128 on the H200; at a reduction of 1408
// the down GEMM lost 9 % at b1 with them, and 8 or 6 of them at small grids lost too). Neither the
// stage count nor the width changes a sum's order.
template <int BM, bool kGated>
void launch(const void* a, int topk, const gpu::MoePlan& plan, int64_t max_tiles, const void* w0, const void* w1,
            int64_t N, int64_t Kd, void* out, cudaStream_t s) {
  if (max_tiles == 0) return;
  const bool wide = Kd % 128 == 0 && Kd >= 2048;
  if constexpr (BM == 16)
    if (max_tiles * (N / kBN) <= 2 * int64_t(device_sms())) {
      if (wide) return launch_stages<BM, kGated, 4, 2>(a, topk, plan, max_tiles, w0, w1, N, Kd, out, s);
      return launch_stages<BM, kGated, 8, 1>(a, topk, plan, max_tiles, w0, w1, N, Kd, out, s);
    }
  if (wide) return launch_stages<BM, kGated, 2, 2>(a, topk, plan, max_tiles, w0, w1, N, Kd, out, s);
  launch_stages<BM, kGated, 4, 1>(a, topk, plan, max_tiles, w0, w1, N, Kd, out, s);
}
// ==== Body 2: wgmma + TMA (sm_90a), 128-row tiles ============================================
// Persistent: one block an SM takes jobs (tile, column slice): its first is blockIdx.x, the next
// ones come from the plan's counter (so jobs start in the order the hardware would start blocks,
// and an expert's tiles run together), and the producer brings a job's first stages while the
// consumers store the last one's outputs. Thread 0 hands each job to the other threads through a
// two-slot ring in shared memory. The last block to finish sets the counters back to 0, so a plan
// serves any number of launches.
// 384 threads: warpgroup 0 produces (gate/up: every thread gathers its activation chunks with
// cp.async and arrives on the stage's barrier when they land, thread 0 brings the weight boxes with
// TMA; down: thread 0 brings the tile's 128 contiguous rows as one TMA box, then the weights),
// warpgroups 1 and 2 consume (rows [64·wg, +64) of the tile). A stage: A [128 rows][64] then each
// weight matrix [BNW rows][64], 128-byte swizzled, K-major (the layout TMA writes and wgmma reads).
// Past a down tile's own rows the box holds the next rows (or zeros past h's end): they only reach
// outputs that are never stored. (A TMA box per gathered row, issued by one warp, made gate/up 4×
// slower on the H200: bench/NOTES.md.)
namespace hopper {
constexpr int BM = 128, BK = 64, kStages = 4, kThreads = 384;
// Registers a thread of the producer warpgroup and of the two consumer warpgroups: 128 · 72 + 256 ·
// 216 = 384 · 168, the registers the block holds (ptxas's count; expect_register_pool checks it).
constexpr int kProducerRegs = 72, kConsumerRegs = 216;
template <bool kGated>
struct Cfg {
  static constexpr int kB = kGated ? 2 : 1;                   // weight matrices a tile reads
  static constexpr int BNW = kGated ? 128 : 256;              // output columns of a tile
  static constexpr int kABytes = BM * BK * 2;                 // 16 KB
  static constexpr int kBBytes = BNW * BK * 2;                // 16 / 32 KB per weight matrix
  static constexpr int kStageBytes = kABytes + kB * kBBytes;  // 48 KB
  // A consumer warpgroup's outputs on their way out: [2 chunks of 64 columns][64 rows][64], 128-byte
  // swizzled (the layout of the TMA store); down's 256 columns go out in two rounds.
  static constexpr int kOutBytes = 2 * 64 * 128;  // 16 KB a warpgroup
  // After the stages: the two warpgroups' output buffers; full[kStages], empty[kStages], job_full[2],
  // job_empty[2] (mbarriers), job_slot[2].
  static constexpr int kSmemBytes =
      1024 /*alignment slack*/ + kStages * kStageBytes + 2 * kOutBytes + (2 * kStages + 4) * 8 + 2 * 4;
  static_assert(kSmemBytes <= 227 * 1024, "an H200 block holds 227 KB of shared memory");
  static constexpr int kJobReaders = (kGated ? 127 : 0) + 256;  // every thread but 0 that takes jobs
};

// tw0 (and tw1 = up): the weights [E, N, Kd] as a 3-D map, boxes of 64 × BNW × 1; ta (down): h
// [rows, Kd] as a 3-D map, boxes of 64 × 128 × 1 (gate/up gathers x from `a`); to: out [rows, N],
// boxes of 64 × 64 × 1.
template <bool kGated>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_k(const __grid_constant__ CUtensorMap tw0, const __grid_constant__ CUtensorMap tw1,
                const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap to, const bf16* a,
                int topk, gpu::MoePlan plan, int N, int Kd, bf16* out) {
  gpu::pdl_enter();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<kGated>;
  // Jobs in gpu::moe_job_at's order: expert by expert, each expert's tiles of a column slice side
  // by side (tile by tile, V3's gate/up took 5.5 % longer and its down 7 %).
  const int slices = N / C::BNW, jobs = *plan.num_tiles * slices, nk = Kd / BK;
  extern __shared__ uint8_t smem_wg[];
  const uint32_t base = (smem_u32(smem_wg) + 1023u) & ~1023u, obuf = base + kStages * C::kStageBytes,
                 bars = obuf + 2 * C::kOutBytes;
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  auto job_full = [&](int k) { return bars + 8u * (2 * kStages + (k & 1)); };
  auto job_empty = [&](int k) { return bars + 8u * (2 * kStages + 2 + (k & 1)); };
  int* const job_slot = reinterpret_cast<int*>(smem_wg + (bars - smem_u32(smem_wg)) + 8 * (2 * kStages + 4));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // gate/up: the producers' cp.async arrivals + thread 0's expect_tx; down: thread 0's alone
      mbar_init(full(s), kGated ? 128 + 1 : 1);
      mbar_init(empty(s), 256);  // every consumer thread releases each stage it was handed
    }
    for (int k = 0; k < 2; ++k) mbar_init(job_full(k), 1), mbar_init(job_empty(k), C::kJobReaders);
    fence_mbarrier_init();
  }
  __syncthreads();
  // The k-th job of this block: thread 0 claims and publishes it, the others take it from the ring.
  // Thread 0 claims job k once it has issued job k − 1's last stage (the consumers are kStages
  // stages from done), so a block takes its next job when it is nearly free.
  int* const counters = plan.jobs + (kGated ? 0 : 2);  // jobs handed out past gridDim.x, blocks done
  auto next_job = [&](int k) {
    if (tid == 0) {
      const int job = k == 0 ? int(blockIdx.x) : int(gridDim.x) + atomicAdd(counters, 1);
      if (k >= 2) mbar_wait(job_empty(k), ((k >> 1) - 1) & 1);
      job_slot[k & 1] = job;
      mbar_arrive(job_full(k));
      if (job >= jobs) {
        __threadfence();  // this block's last fetch comes before its "done"
        if (atomicAdd(counters + 1, 1) == int(gridDim.x) - 1) atomicExch(counters, 0), atomicExch(counters + 1, 0);
      }
      return job;
    }
    mbar_wait(job_full(k), (k >> 1) & 1);
    const int job = *static_cast<volatile int*>(job_slot + (k & 1));
    mbar_arrive(job_empty(k));
    return job;
  };
  // Stage uses count on across jobs (it): stage it % kStages, its phase (it / kStages) & 1.

  if (warp < 4) {  // ---- producer
    setmaxnreg_dec<kProducerRegs>();
    if (!kGated && tid != 0) return;
    for (int k = 0, it = 0;; ++k) {
      const int job = next_job(k);
      if (job >= jobs) break;
      const auto [e, r0, slice] = gpu::moe_job_at(job, slices, BM, plan.tiles, plan.offsets);
      const int n0 = slice * C::BNW;
      // gate/up: this thread gathers chunk column tid % 8 of rows tid / 8 + 16 i (the token row in
      // x, −1: past the tile's rows, zero-filled)
      [[maybe_unused]] const int c = tid & 7;
      [[maybe_unused]] int row[kGated ? BM / 16 : 1];
      if constexpr (kGated) {
        const int nrows = min(BM, plan.offsets[e + 1] - r0);
#pragma unroll
        for (int i = 0; i < BM / 16; ++i) {
          const int r = (tid >> 3) + 16 * i;
          row[i] = r < nrows ? plan.rows[r0 + r] / topk : -1;
        }
      }
      for (int kt = 0; kt < nk; ++kt, ++it) {
        const int s = it % kStages;
        if (it >= kStages) mbar_wait(empty(s), (it / kStages - 1) & 1);
        const uint32_t sa = base + s * C::kStageBytes;
        if constexpr (kGated) {
#pragma unroll
          for (int i = 0; i < BM / 16; ++i)
            cp_async(sa + swz128((tid >> 3) + 16 * i, c), a + size_t(max(row[i], 0)) * Kd + kt * BK + c * 8,
                     row[i] >= 0);
          cp_async_mbar_arrive(full(s));
        }
        if (tid == 0) {
          mbar_expect_tx(full(s), (kGated ? 0 : C::kABytes) + C::kB * C::kBBytes);
          if constexpr (!kGated) tma_load_3d(sa, &ta, full(s), kt * BK, r0, 0);
          tma_load_3d(sa + C::kABytes, &tw0, full(s), kt * BK, n0, e);
          if constexpr (kGated) tma_load_3d(sa + C::kABytes + C::kBBytes, &tw1, full(s), kt * BK, n0, e);
        }
      }
    }
  } else {  // ---- consumers
    const int wg = (warp >> 2) - 1, wl = warp & 3;
    setmaxnreg_inc<kConsumerRegs>();
    float acc[C::kB][C::BNW / 2];
    for (int k = 0, it = 0;; ++k) {
      const int job = next_job(k);
      if (job >= jobs) break;
      const auto [e, r0, slice] = gpu::moe_job_at(job, slices, BM, plan.tiles, plan.offsets);
      const int n0 = slice * C::BNW;
      const int nrows = min(BM, plan.offsets[e + 1] - r0);
      if (wg * 64 >= nrows) {  // an expert's last tile of ≤ 64 rows: the other warpgroup does it
        for (int kt = 0; kt < nk; ++kt, ++it) {
          mbar_wait(full(it % kStages), (it / kStages) & 1);
          mbar_arrive(empty(it % kStages));
        }
        continue;
      }
#pragma unroll
      for (int b = 0; b < C::kB; ++b)
#pragma unroll
        for (int i = 0; i < C::BNW / 2; ++i) acc[b][i] = 0.f;
      for (int kt = 0; kt < nk; ++kt, ++it) {
        const int s = it % kStages;
        mbar_wait(full(s), (it / kStages) & 1);
        if constexpr (kGated) fence_proxy_async();  // the cp.async (generic proxy) rows → wgmma (async proxy)
        const uint32_t sa = base + s * C::kStageBytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          const uint64_t da = sw128_desc(sa + wg * 64 * 128 + kk * 32, 16, 1024);
#pragma unroll
          for (int b = 0; b < C::kB; ++b) {
            const uint64_t db = sw128_desc(sa + C::kABytes + b * C::kBBytes + kk * 32, 16, 1024);
            if constexpr (C::BNW == 256) wgmma_m64n256k16_ss<0, 0>(acc[b], da, db, 1);
            else wgmma_m64n128k16_ss<0, 0>(acc[b], da, db, 1);
          }
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's products are done: hand it back
        if (kt > 0) mbar_arrive(empty((it - 1) % kStages));
      }
      wgmma_wait<0>();
      mbar_arrive(empty((it - 1) % kStages));
#pragma unroll
      for (int b = 0; b < C::kB; ++b) reg_fence(acc[b]);

      // Fragment: acc[b][4j + 2h + {0, 1}] is row 16·wl + lane/4 + 8h, columns 8j + 2·(lane%4) + {0, 1}.
      auto value = [&](int i) {  // output i of this thread's fragment
        if constexpr (kGated) return silu_mul_bf16(acc[0][i], acc[1][i]);
        else return acc[0][i];
      };
      if (wg * 64 + 64 <= nrows) {
        // All 64 rows are the tile's own: through shared memory (stmatrix) and out by TMA, 128 columns
        // a round, while the other warpgroup and the producer go on. The leader waits for its last
        // store to have read the buffer before anyone writes it again.
        const uint32_t ob = obuf + wg * C::kOutBytes;
        const bool leader = wl == 0 && lane == 0;
        // lane → the row address it gives stmatrix: row (lane & 7) + 8 h of its warp's 16, 8-column
        // block t of the pair, for matrix i = lane / 8 = 2 t + h
        const int mrow = wl * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), mcol = lane >> 4;
#pragma unroll
        for (int rd = 0; rd < C::BNW / 128; ++rd) {
          if (leader) bulk_wait_read<0>();
          named_bar_sync(1 + wg, 128);
#pragma unroll
          for (int j = 0; j < 16; j += 2) {
            uint32_t r[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int f = 4 * (rd * 16 + j + (i >> 1)) + 2 * (i & 1);
              r[i] = pack_bf16(value(f), value(f + 1));
            }
            const int cb = j + mcol;  // 8-column block of the round's 128 columns
            stmatrix_x4(ob + (cb >> 3) * (64 * 128) + swz128(mrow, cb & 7), r);
          }
          fence_proxy_async();
          named_bar_sync(1 + wg, 128);
          if (leader) {
            for (int c = 0; c < 2; ++c) tma_store_3d(&to, ob + c * (64 * 128), n0 + rd * 128 + c * 64, r0 + wg * 64, 0);
            bulk_commit();
          }
        }
        continue;
      }
      // An expert's last rows: stored straight from registers, row by row.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wg * 64 + wl * 16 + (lane >> 2) + 8 * h;
        if (r >= nrows) continue;
        bf16* o = out + size_t(r0 + r) * N + n0 + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < C::BNW / 8; ++j) {
          *reinterpret_cast<uint32_t*>(o + 8 * j) = pack_bf16(value(4 * j + 2 * h), value(4 * j + 2 * h + 1));
        }
      }
    }
    if (wl == 0 && lane == 0) bulk_wait<0>();  // the last stores are done before the block's memory goes
  }
#else
  __trap();  // built without sm_90a: the host never picks this body then
#endif
}

// The weights [E, N, Kd] bf16 as boxes of 64 reduction columns × `rows` output rows × 1 expert (also
// the activations [N rows, Kd] as one "expert").
CUtensorMap weight_map(const void* w, int64_t E, int64_t N, int64_t Kd, int rows) {
  const uint64_t dims[3] = {uint64_t(Kd), uint64_t(N), uint64_t(E)};
  const uint64_t strides[2] = {uint64_t(Kd) * 2, uint64_t(N * Kd) * 2};
  const uint32_t box[3] = {uint32_t(BK), uint32_t(rows), 1};
  return bf16_tensor_map(const_cast<void*>(w), 3, dims, strides, box);
}

template <bool kGated>
void launch(const void* a, int64_t a_rows, int topk, const gpu::MoePlan& plan, int64_t max_tiles, const void* w0,
            const void* w1, int64_t E, int64_t N, int64_t Kd, void* out, cudaStream_t s) {
  using C = Cfg<kGated>;
  if (max_tiles == 0) return;
  static const bool attr = [] {
    MLA_GPU_CHECK(cudaFuncSetAttribute(moe_wgmma_k<kGated>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    expect_register_pool(reinterpret_cast<const void*>(moe_wgmma_k<kGated>), "moe_wgmma_k", kThreads,
                         128 * kProducerRegs + 256 * kConsumerRegs);
    return true;
  }();
  (void)attr;
  const CUtensorMap t0 = weight_map(w0, E, N, Kd, C::BNW), t1 = kGated ? weight_map(w1, E, N, Kd, C::BNW) : t0;
  // One block an SM (at most one a job).
  const unsigned grid = unsigned(std::min<int64_t>(max_tiles * (N / C::BNW), device_sms()));
  const CUtensorMap ta = kGated ? t0 : weight_map(a, 1, a_rows, Kd, BM);
  const CUtensorMap to = weight_map(out, 1, a_rows * topk, N, 64);  // out [a_rows · topk, N]
  gpu::launch(moe_wgmma_k<kGated>, grid, kThreads, C::kSmemBytes, s, t0, t1, ta, to, static_cast<const bf16*>(a),
              topk, plan, int(N), int(Kd), static_cast<bf16*>(out));
}

bool available() {
  static const bool ok = sm90a_runs(reinterpret_cast<const void*>(moe_wgmma_k<false>));
  return ok;
}
}  // namespace hopper

}  // namespace

int moe_fast_rows(int64_t n, int64_t E, int64_t I, int64_t hidden) {
  // 128-row tiles once experts average 96 rows (prefill): the wgmma body, which takes 128 gate/up
  // and 256 down columns a block.
  if (n >= 96 * E && I % hopper::Cfg<true>::BNW == 0 && hidden % hopper::Cfg<false>::BNW == 0 && hopper::available())
    return hopper::BM;
  // 32-row tiles once experts average 20 rows (decode at b256 for V2-Lite: 24): at 16 most
  // experts would take two tiles, each streaming the expert's weights.
  return n >= 48 * E ? 64 : n >= 20 * E ? 32 : 16;
}

bool moe_fast_supports(int64_t I, int64_t hidden) { return I > 0 && hidden > 0 && I % 64 == 0 && hidden % 64 == 0; }

void moe_gate_up_fast(const void* x, int64_t T, int topk, const gpu::MoePlan& plan, int64_t max_tiles, int bm,
                      const void* gate, const void* up, int64_t E, int64_t I, int64_t hidden, void* h, cudaStream_t s) {
  if (bm == hopper::BM) hopper::launch<true>(x, T, topk, plan, max_tiles, gate, up, E, I, hidden, h, s);
  else if (bm == 64) launch<64, true>(x, topk, plan, max_tiles, gate, up, I, hidden, h, s);
  else if (bm == 32) launch<32, true>(x, topk, plan, max_tiles, gate, up, I, hidden, h, s);
  else launch<16, true>(x, topk, plan, max_tiles, gate, up, I, hidden, h, s);
}

void moe_down_fast(const void* h, int64_t n, const gpu::MoePlan& plan, int64_t max_tiles, int bm, const void* down,
                   int64_t E, int64_t I, int64_t hidden, void* y, cudaStream_t s) {
  if (bm == hopper::BM) hopper::launch<false>(h, n, 1, plan, max_tiles, down, nullptr, E, hidden, I, y, s);
  else if (bm == 64) launch<64, false>(h, 1, plan, max_tiles, down, nullptr, hidden, I, y, s);
  else if (bm == 32) launch<32, false>(h, 1, plan, max_tiles, down, nullptr, hidden, I, y, s);
  else launch<16, false>(h, 1, plan, max_tiles, down, nullptr, hidden, I, y, s);
}

}  // namespace mla::cuda
