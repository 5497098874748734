// mla/ops.h — the small per-platform ops interface the forward methods are written against.
// Tensors passed to an Ops live on its platform. Activations use act_dtype(); LSE is f32 (f64 in the
// CPU reference flavour), natural log, −inf for a query that saw no key. Shapes: T new tokens, S key rows, H heads.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mla/batch.h"
#include "mla/kv_pool.h"
#include "mla/moe.h"
#include "mla/rope.h"
#include "mla/sampling.h"
#include "mla/tensor.h"
#include "mla/weights.h"

namespace mla {

// One piece of device work as the device recorded it (Ops::activity_end): a kernel (its name), a
// copy ("memcpy") or a memset ("memset"), with its start and end on the device's clock (ns).
struct DeviceSpan {
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t stream = 0;
  std::string name;
};

// What an Ops did between the host and the device: during a step (step_counters) or since it was
// made (counters). The CPU does none of it and reports zeros.
struct StepCounters {
  int64_t h2d_copies = 0;        // host → device copies
  int64_t d2h_copies = 0;        // device → host copies
  // Waits of the host for the device: stream synchronizations, copies to the host, copies from
  // pageable host memory (the runtime may wait for the stream before staging them), pinned-buffer
  // waits. (A growing plan's pinned buffer is replaced without one: the old one is freed later.)
  int64_t host_syncs = 0;
  int64_t decode_schedules = 0;  // MLA decode split schedules computed (once per step and shape)
  int64_t graph_captures = 0;    // steps recorded as graphs (begin_capture … end_capture)
  int64_t graph_replays = 0;     // steps run by replaying a graph

  StepCounters operator-(const StepCounters& o) const {
    return {h2d_copies - o.h2d_copies,           d2h_copies - o.d2h_copies,
            host_syncs - o.host_syncs,           decode_schedules - o.decode_schedules,
            graph_captures - o.graph_captures, graph_replays - o.graph_replays};
  }
};

class SideLane;

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Platform platform() const = 0;
  virtual std::string name() const = 0;  // e.g. "cpu-ref", "cpu-f32", "cpu-bf16"
  virtual DType act_dtype() const = 0;   // activation and weight storage
  virtual DType lse_dtype() const { return DType::F32; }  // the f64 reference keeps f64

  // ---- memory ---------------------------------------------------------------------------------
  virtual Tensor empty(DType dtype, Shape shape) = 0;
  virtual Tensor upload(const Tensor& host) = 0;      // same dtype, on this platform
  virtual Tensor download(const Tensor& t) = 0;       // a host copy
  virtual void fill(Tensor& t, double value) = 0;     // every element (NaN allowed)
  // Element i = hash_normalish(seed, i, std) (mla/random.h): the same values on every platform.
  virtual void fill_random(Tensor& t, uint64_t seed, double std) = 0;
  virtual void synchronize() {}
  // A host copy of `t` behind the work issued so far, collected later: wait() returns it once that
  // work is done, not waiting for work issued after this call. GPUs copy into page-locked memory on
  // the stream and record an event, so the host can plan and issue the next step while this one
  // runs; the default copies at once. A HostCopy must not outlive its Ops.
  class HostCopy {
   public:
    virtual ~HostCopy() = default;
    virtual Tensor wait() = 0;
  };
  virtual std::unique_ptr<HostCopy> download_later(const Tensor& t);

  // ---- loading --------------------------------------------------------------------------------
  // Host memory upload_async copies from at full speed (page-locked on GPUs; plain on the CPU).
  virtual std::shared_ptr<void> alloc_staging(size_t bytes);
  // dst's bytes [offset, offset + n) ← host[0, n). May return before the copy ends (GPUs): `host`
  // must stay unchanged until wait_upload(slot); slot in [0, kUploadSlots) names the copy.
  static constexpr int kUploadSlots = 4;
  virtual void upload_async(const void* host, Tensor& dst, size_t offset, size_t n, int slot);
  virtual void wait_upload(int slot) {}

  // ---- steps ----------------------------------------------------------------------------------
  // One forward step over `plan` (every layer of a model, or one layer alone), between begin_step
  // and end_step. A GPU platform checks the plan's slots against `pool` once, uploads the plan's
  // per-step arrays (positions, slots, both segment sets, and the `extra` vectors: a model's token
  // ids and logit rows; null entries are skipped) in one copy to a device buffer at a stable
  // address, and resolves op calls given those same vectors to it. The plan, pool and extra
  // vectors must outlive the step, unchanged. Throws Error (and opens no step) when a
  // slot is outside the pool or a step is already open. Default: nothing to do.
  virtual void begin_step(const BatchPlan& plan, const KVPool& pool,
                          std::initializer_list<const std::vector<int32_t>*> extra = {}) {}
  virtual void end_step() noexcept {}  // closes the open step, if any
  // True where begin_step copies the plan and its extra vectors to the device, so step_rows_from
  // works; false on the CPU, whose ops read the host vectors themselves.
  virtual bool step_plan_on_device() const { return false; }
  // Inside an open step: element i of the device copy of extra vector `v` ← the I32 tensor
  // `src` at from[i], wherever from[i] >= 0 (from: v.size() entries), in stream order: values the
  // host does not have yet, e.g. the last step's sampled ids. Each run of consecutive rows is one
  // copy. Error where step_plan_on_device() is false, `v` is not an extra vector of the open step
  // or a row is outside `src`.
  virtual void step_rows_from(const std::vector<int32_t>& v, const Tensor& src, const std::vector<int32_t>& from);
  // True inside a step over this plan and pool: its slots were checked against the pool.
  virtual bool step_checked(const BatchPlan& plan, const KVPool& pool) const { return false; }
  // The open step's counts so far, or the last closed step's; zeros on the CPU.
  virtual StepCounters step_counters() const { return {}; }
  virtual StepCounters counters() const { return {}; }  // since the Ops was made

  // ---- step graphs ----------------------------------------------------------------------------
  // A platform that can record the op calls of an open step once (CUDA graphs) and replay them for
  // later steps of the same shapes, without the host launching each kernel. The contract that makes
  // a replay equal to running the calls again, bit for bit: every launch choice a platform makes in
  // a step depends only on the plan's shapes (its token and request counts, each request's new_len,
  // kv_bucket(): the longest request rounded up to a power of two) and on its launch_class below,
  // never on the lengths themselves, which the kernels read from the step's device plan; and that
  // device plan keeps its addresses for plans of equal shapes.
  class StepGraph {
   public:
    virtual ~StepGraph() = default;
  };
  virtual bool can_capture() const { return false; }
  // What else of a step's plan this platform's launch choices follow, for attention of `heads`
  // query heads a token (this rank's): a class the platform defines, equal for plans it launches
  // alike. Step graphs are keyed on it with the shapes above, so they split only where a kernel
  // differs. CUDA: whether its decode takes the persistent grid (which follows the plan's
  // kv_fill(), how full the batch's rectangle of keys is); 0 where the choices follow nothing more.
  virtual int32_t launch_class(const BatchPlan& plan, int64_t heads) const { return 0; }
  // Inside an open step: the op calls up to end_capture are recorded into a graph, not run. A call
  // that cannot be recorded (a host copy from pageable memory, a synchronization, a buffer that
  // would have to grow) throws Error; end_capture must follow either way. Error where
  // can_capture() is false.
  virtual void begin_capture();
  // Ends the recording. Returns the graph, or throws Error (after the platform is back to running
  // calls) when the recording failed: `failed` says a call inside it threw.
  virtual std::unique_ptr<StepGraph> end_capture(bool failed = false);
  // Runs a graph recorded by this Ops in the open step. Returns false, running nothing, when the
  // graph no longer fits the step (another layout of the device plan, or the plan moved).
  virtual bool replay(const StepGraph& g);

  // ---- timeline (benchmarks) ------------------------------------------------------------------
  // With the timeline on, mark(label) notes when the platform reaches this point of its work (a
  // GPU: an event in its stream, recorded into step graphs too; the CPU: the host clock), opening a
  // section `label` that lasts to the next mark. timeline() waits for the platform and returns the
  // sections of the last step (or of the marks since the last call, outside steps) in order, in
  // milliseconds; the last mark only closes the one before it. `label` must outlive the step.
  // Graphs recorded with the timeline off do not replay with it on, and the other way round.
  void set_timeline(bool on) {
    timeline_on_ = on;
    marks_.clear();
  }
  bool timeline_on() const { return timeline_on_; }
  virtual void mark(const char* label);
  virtual std::vector<std::pair<std::string, double>> timeline();

  // ---- device activity (benchmarks) -----------------------------------------------------------
  // The device's own record of its work between activity_begin() and activity_end() (which waits
  // for the device): every kernel, copy and memset, graph nodes included. Error on a platform that
  // keeps no such record (can_record_activity() false).
  virtual bool can_record_activity() const { return false; }
  virtual void activity_begin();
  virtual std::vector<DeviceSpan> activity_end();

  // ---- a side lane: work that may run alongside --------------------------------------------------
  // side_begin(): the calls up to side_end() form a side lane, which starts after every earlier
  // call and may run alongside the calls made after side_end(); after side_join(), calls run after
  // the side lane's too. The results are those of the calls in program order as long as the two
  // lanes write disjoint tensors and read nothing the other writes before the join (the caller's
  // part). Tensors made in the side lane live at least to the join. A platform without concurrency
  // runs the calls in order (the default). Error for calls out of this order (GPU platforms).
  virtual void side_begin() {}
  virtual void side_end() {}
  virtual void side_join() {}

  // ---- weights --------------------------------------------------------------------------------
  // A platform may keep the absorbed weights in its own packed form (ROCm: fp8, MXFP4, or a
  // K-contiguous layout); the result travels with the layer's weights to the platform's own
  // methods. Default: nothing to pack.
  virtual std::shared_ptr<const void> pack_absorbed(const AbsorbedWeights& host) { return nullptr; }
  virtual bool packs_absorbed() const { return false; }  // whether pack_absorbed returns anything
  // The absorbed weights as that packed form represents them, when they differ from `host`
  // (quantized): the reference harness judges the platform's absorbed methods against these.
  virtual std::optional<AbsorbedWeights> absorbed_as_packed(const AbsorbedWeights& host) const {
    return std::nullopt;
  }

  // ---- dense steps ----------------------------------------------------------------------------
  // y[M, N] = x[M, K] · w[N, K]ᵀ
  virtual void linear(const Tensor& x, const Tensor& w, Tensor& y) = 0;
  // x[M, ld]: RMSNorm over columns [0, n) of each row, in place, times w[n]
  virtual void rmsnorm(Tensor& x, int64_t n, const Tensor& w, double eps) = 0;
  // h[M, n] += y[M, n]; then x[M, n] = RMSNorm(h) · w[n]: the residual add and the next norm, as
  // add(h, y); copy(h, x); rmsnorm(x, n, w, eps) give them, bit for bit (a platform may fuse them).
  virtual void add_rmsnorm(Tensor& h, const Tensor& y, Tensor& x, const Tensor& w, double eps);
  // x[T, heads·head_dim]: RoPE on columns [rot_offset, rot_offset + rope_dim) of every head
  virtual void rope(Tensor& x, int64_t heads, int64_t head_dim, int64_t rot_offset,
                    const std::vector<int32_t>& positions, const RopeFrequencies& f) = 0;
  // dst[M, dld][:, d0 : d0 + n] = src[M, sld][:, s0 : s0 + n] (same dtype)
  virtual void copy_cols(const Tensor& src, int64_t s0, Tensor& dst, int64_t d0, int64_t n) = 0;
  // out[M, n] = x[M, ld][:, c0 : c0 + n]
  void take_cols(const Tensor& x, int64_t c0, Tensor& out) { copy_cols(x, c0, out, 0, out.dim(-1)); }

  // ---- latent cache ---------------------------------------------------------------------------
  // rows[T, row_dim] → pool layer rows at slots[T] (quantized by the layer scale)
  virtual void cache_write(KVPool& pool, int64_t layer, const std::vector<int32_t>& slots,
                           const Tensor& rows) = 0;
  // pool layer rows at slots[S] → rows[S, row_dim] in rows' dtype (dequantized)
  virtual void cache_read(const KVPool& pool, int64_t layer, const std::vector<int32_t>& slots,
                          Tensor& rows) = 0;
  // The end of the latent path for a step's new tokens: q[T, heads, hd], kva[T, row_dim] →
  // rmsnorm(kva, kv_lora_rank, w, eps); rope(q, heads, hd, q_rot, positions, f);
  // rope(kva, 1, row_dim, kv_lora_rank, positions, f); cache_write(pool, layer, slots, kva) —
  // those calls' bits (a platform may fuse them). heads 0: q is left alone (it may be undefined), as
  // when absorb_q_rope rotates q's rope columns instead.
  virtual void finish_latent(Tensor& q, int64_t heads, int64_t q_rot, Tensor& kva, int64_t kv_lora_rank,
                             const Tensor& w, double eps, const std::vector<int32_t>& positions,
                             const RopeFrequencies& f, KVPool& pool, int64_t layer, const std::vector<int32_t>& slots);

  // ---- MHA steps ------------------------------------------------------------------------------
  // kv[S, H·(dn+dv)] (decompressed) + rows[S, row_dim] (k_pe at column kv_lora_rank)
  //   → k[S, H, dn+dr] = [k_nope | k_pe broadcast], v[S, H, dv]
  virtual void build_kv(const Tensor& kv, const Tensor& rows, int64_t kv_lora_rank, int64_t heads,
                        int64_t dn, int64_t dr, int64_t dv, Tensor& k, Tensor& v) = 0;
  // Ragged attention: q[Tq, H, dqk], k[S, H, dqk], v[S, H, dv] → o[Tq, H, dv], lse[Tq, H] f32.
  // Queries outside every segment are left untouched.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttnSegments& seg, double scale, Tensor& o, Tensor& lse) = 0;
  // (o, lse) ← merge((o, lse), (o_b, lse_b)); o[T, H, d], lse[T, H]
  virtual void merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b) = 0;

  // ---- model steps (embedding, residuals, MLP, MoE) ------------------------------------------
  // out[n, d] = table[ids[i], :] (ids are checked by the caller)
  virtual void gather_rows(const Tensor& table, const std::vector<int32_t>& ids, Tensor& out) = 0;
  // out[rows[i], :] += weights[i] · src[i, :]   src[n, d], out[M, d]; rows may repeat
  virtual void scatter_add_rows(const Tensor& src, const std::vector<int32_t>& rows,
                                const std::vector<float>& weights, Tensor& out) = 0;
  virtual void add(Tensor& x, const Tensor& y) = 0;        // x += y, same element count
  virtual void copy(const Tensor& src, Tensor& dst) = 0;   // same element count, dtypes may differ
  // out[M, I] = silu(gate[M, I]) · up[M, I]
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // out[M, I] = silu(x · gateᵀ) · (x · upᵀ)   x[M, d], gate and up [I, d]: the MLP's first half, with
  // the bits of linear(x, gate), linear(x, up) and silu_mul (what this default calls).
  virtual void gate_up(const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& out);

  // ---- MoE ----------------------------------------------------------------------------------
  // T tokens, E = n_routed_experts, K = num_experts_per_tok. Sizes stay on the platform: no host
  // round trip, no synchronization (a decode step may be captured whole).
  // router_logits[T, E] f32, bias[E] f32 (e_score_correction_bias) or undefined
  //   → expert[T, K] i32, weight[T, K] f32: route_tokens' choice (ids exactly, weights in f32).
  virtual void moe_route(const Tensor& router_logits, const Tensor& bias, const MoeRouting& r,
                         Tensor& expert, Tensor& weight) = 0;
  // x[T, hidden] · router[E, hidden]ᵀ → router_logits[T, E] f32, then moe_route's choice from them:
  // linear + moe_route (a platform may fuse them; its logits then sum each row in one fixed order).
  // router f32, or bf16 beside bf16 x (widened exactly: f32 products either way); any other pair is
  // an error (check_router_dtype).
  virtual void moe_router(const Tensor& x, const Tensor& router, const Tensor& bias, const MoeRouting& r,
                          Tensor& router_logits, Tensor& expert, Tensor& weight);
  // x[T, hidden], expert[T, K] i32, weight[T, K] f32; stacked experts gate[E, I, hidden],
  // up[E, I, hidden], down[E, hidden, I] → out[T, hidden] (overwritten):
  //   out[t] = Σ_{k=0..K-1} weight[t, k] · down_e(silu(gate_e · x_t) ⊙ up_e · x_t), e = expert[t, k],
  // summed in k order. A token's row never depends on the other tokens of the batch.
  virtual void moe_experts(const Tensor& x, const Tensor& expert, const Tensor& weight,
                           const Tensor& gate, const Tensor& up, const Tensor& down, Tensor& out) = 0;
  // moe_experts, with `add` [T, hidden] (the shared experts' output, made in `lane`) added to out:
  // the bits of moe_experts(…, out); lane.join(); add(out, add). A platform may run the routed
  // experts beside the lane and join it only before their weighted sum, which then adds `add`.
  virtual void moe_experts_add(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate,
                               const Tensor& up, const Tensor& down, SideLane& lane, const Tensor& add, Tensor& out);

  // ---- sampling -------------------------------------------------------------------------------
  // x[R, V] f32 → out[R] I32: per row the greedy choice, greedy_index's rule (mla/greedy.h: the
  // first index of the largest value; NaN never wins).
  virtual void argmax_rows(const Tensor& x, Tensor& out) = 0;
  // x[R, V] f32 → out[R] I32: per row r the token sample_index(row r, rows[r]) draws (mla/sampling.h:
  // temperature, top-k, top-p, min-p, then the draw with rows[r].u; greedy_index's choice when
  // temperature is 0 or top_k is 1). rows.size() == R, values as the host sampler validates them.
  // A GPU gives the CPU's ids but where u lies within rounding of a cumulative boundary (its sums
  // run in another order); only R rows of parameters go up (one small copy).
  virtual void sample_rows(const Tensor& x, const std::vector<SampleRow>& rows, Tensor& out) = 0;

  // ---- MLA steps ------------------------------------------------------------------------------
  // q[T, H, dn+dr] → q_mla[T, H, kv_lora_rank + dr] = [q_nope[h] · w_kc[h] | q_pe]
  //   w_kc[H, dn, kv_lora_rank]
  virtual void absorb_q(const Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr,
                        Tensor& q_mla) = 0;
  // q[T, H, dn+dr] → q_mla as absorb_q makes it from q with its rope columns rotated: rope(q, H,
  // dn + dr, dn, positions, f); absorb_q(q, w_kc, dn, dr, q_mla) — those calls' bits (a platform may
  // fuse them; q's own rope columns are then left as they were).
  virtual void absorb_q_rope(Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr,
                             const std::vector<int32_t>& positions, const RopeFrequencies& f, Tensor& q_mla);
  // Whether the MLA prepare should leave q's RoPE to absorb_q_rope (true where that is one launch
  // for `tokens` tokens with these weights, w_kc[H, dn, kv_lora_rank], and frequencies) rather than
  // to finish_latent beside the latent rows' (where the rope would be a launch of its own). Either
  // answer gives the same bits.
  virtual bool absorb_q_rope_fused(int64_t tokens, const Tensor& w_kc, int64_t dr, const RopeFrequencies& f) const {
    (void)tokens, (void)w_kc, (void)dr, (void)f;
    return false;
  }
  // o_lat[T, H, kv_lora_rank] · w_vc[h]ᵀ → o[T, H, dv];  w_vc[H, dv, kv_lora_rank]
  virtual void absorb_o(const Tensor& o_lat, const Tensor& w_vc, Tensor& o) = 0;
  // Absorbed attention of q[T, H, row_dim] against latent rows of the pool: keys of request r
  // are rows kv_slots[k_start .. k_start + k_len); scores over the whole row, values are its
  // first kv_lora_rank columns → o[T, H, kv_lora_rank], lse[T, H] f32.
  virtual void mla_attention(const Tensor& q, const KVPool& pool, int64_t layer,
                             const std::vector<int32_t>& kv_slots, const AttnSegments& seg,
                             int64_t kv_lora_rank, double scale, Tensor& o, Tensor& lse) = 0;

 protected:
  // moe_experts_add's added rows: as many as out's elements, on out's platform (else an Error).
  static void check_moe_add(const Tensor& add, const Tensor& out);
  bool timeline_on_ = false;
  std::vector<std::pair<const char*, double>> marks_;  // the host clock's marks (seconds)
};

// Opens a step on construction and closes it on destruction, also when an Error unwinds.
class StepScope {
 public:
  StepScope(Ops& ops, const BatchPlan& plan, const KVPool& pool,
            std::initializer_list<const std::vector<int32_t>*> extra = {})
      : ops_(ops) {
    ops_.begin_step(plan, pool, extra);
  }
  ~StepScope() { ops_.end_step(); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  Ops& ops_;
};

// The scope of a side lane (Ops::side_begin): begun on construction; main() ends the lane's calls,
// join() joins it; the destructor does what is left (an error between them leaves nothing open).
class SideLane {
 public:
  explicit SideLane(Ops& ops) : ops_(ops) { ops_.side_begin(); }
  SideLane(const SideLane&) = delete;
  SideLane& operator=(const SideLane&) = delete;
  void main() {
    if (state_ == 0) ops_.side_end(), state_ = 1;
  }
  void join() {
    main();
    if (state_ == 1) ops_.side_join(), state_ = 2;
  }
  ~SideLane() {
    try {
      join();
    } catch (...) {  // a destructor reports nothing; the error that unwound us is the one that counts
    }
  }

 private:
  Ops& ops_;
  int state_ = 0;  // 0 in the lane, 1 ended, 2 joined
};

// Error unless the router of Ops::moe_router is f32 or the dtype of its activations x.
void check_router_dtype(const Tensor& x, const Tensor& router);

}  // namespace mla
