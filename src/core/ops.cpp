// The Ops defaults: loading by plain copies (for platforms whose memory the host addresses) and
// the residual add with the next RMSNorm as three steps.
#include "mla/ops.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "mla/error.h"

namespace mla {

std::shared_ptr<void> Ops::alloc_staging(size_t bytes) {
  void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  if (!p) fail("{}: cannot allocate {} bytes of staging memory", name(), bytes);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void Ops::upload_async(const void* host, Tensor& dst, size_t offset, size_t n, int slot) {
  if (dst.platform() != Platform::CPU) fail("{}: upload_async to a {} tensor", name(), platform_name(dst.platform()));
  if (offset + n > dst.nbytes() || slot < 0 || slot >= kUploadSlots)
    fail("{}: upload of {} bytes at {} into a tensor of {} bytes (slot {})", name(), n, offset, dst.nbytes(), slot);
  std::memcpy(static_cast<char*>(dst.data()) + offset, host, n);
}

namespace {
class ReadyCopy final : public Ops::HostCopy {  // the default download_later: already here
 public:
  explicit ReadyCopy(Tensor t) : t_(std::move(t)) {}
  Tensor wait() override { return t_; }

 private:
  Tensor t_;
};
}  // namespace

std::unique_ptr<Ops::HostCopy> Ops::download_later(const Tensor& t) { return std::make_unique<ReadyCopy>(download(t)); }

void Ops::step_rows_from(const std::vector<int32_t>&, const Tensor&, const std::vector<int32_t>&) {
  fail("{}: no device plan to copy a step's rows into", name());
}

void Ops::begin_capture() { fail("{}: this platform cannot record step graphs", name()); }

std::unique_ptr<Ops::StepGraph> Ops::end_capture(bool) {
  fail("{}: this platform cannot record step graphs", name());
}

bool Ops::replay(const StepGraph&) { fail("{}: this platform cannot replay step graphs", name()); }

void Ops::mark(const char* label) {
  if (!timeline_on_) return;
  synchronize();
  marks_.emplace_back(label, std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

void Ops::activity_begin() { fail("{}: no record of device activity on this platform", name()); }
std::vector<DeviceSpan> Ops::activity_end() { fail("{}: no record of device activity on this platform", name()); }

std::vector<std::pair<std::string, double>> Ops::timeline() {
  std::vector<std::pair<std::string, double>> t;
  for (size_t i = 0; i + 1 < marks_.size(); ++i)
    t.emplace_back(marks_[i].first, (marks_[i + 1].second - marks_[i].second) * 1e3);
  marks_.clear();
  return t;
}

void Ops::add_rmsnorm(Tensor& h, const Tensor& y, Tensor& x, const Tensor& w, double eps) {
  add(h, y);
  copy(h, x);
  rmsnorm(x, x.dim(-1), w, eps);
}

void check_router_dtype(const Tensor& x, const Tensor& router) {
  if (router.dtype() != DType::F32 && router.dtype() != x.dtype())
    fail("moe_router: a {} router beside {} activations (f32, or the activations' dtype)", dtype_name(router.dtype()),
         dtype_name(x.dtype()));
}

void Ops::gate_up(const Tensor& x, const Tensor& gate, const Tensor& up, Tensor& out) {
  Tensor u = empty(out.dtype(), out.shape());  // [M, I]
  linear(x, gate, out);
  linear(x, up, u);
  silu_mul(out, u, out);
}

void Ops::moe_router(const Tensor& x, const Tensor& router, const Tensor& bias, const MoeRouting& r,
                     Tensor& router_logits, Tensor& expert, Tensor& weight) {
  check_router_dtype(x, router);
  linear(x, router, router_logits);
  moe_route(router_logits, bias, r, expert, weight);
}

void Ops::finish_latent(Tensor& q, int64_t heads, int64_t q_rot, Tensor& kva, int64_t kv_lora_rank, const Tensor& w,
                        double eps, const std::vector<int32_t>& positions, const RopeFrequencies& f, KVPool& pool,
                        int64_t layer, const std::vector<int32_t>& slots) {
  rmsnorm(kva, kv_lora_rank, w, eps);
  if (heads > 0) rope(q, heads, q.dim(-1), q_rot, positions, f);
  rope(kva, 1, kva.dim(-1), kv_lora_rank, positions, f);
  cache_write(pool, layer, slots, kva);
}

void Ops::moe_experts_add(const Tensor& x, const Tensor& expert, const Tensor& weight, const Tensor& gate,
                          const Tensor& up, const Tensor& down, SideLane& lane, const Tensor& add_in, Tensor& out) {
  check_moe_add(add_in, out);
  moe_experts(x, expert, weight, gate, up, down, out);
  lane.join();
  add(out, add_in);
}

void Ops::check_moe_add(const Tensor& add, const Tensor& out) {
  if (!add.defined() || add.numel() != out.numel() || add.platform() != out.platform())
    fail("moe_experts_add: added rows {} for an output of {}", add.defined() ? shape_str(add.shape()) : "(none)",
         shape_str(out.shape()));
}

void Ops::absorb_q_rope(Tensor& q, const Tensor& w_kc, int64_t dn, int64_t dr, const std::vector<int32_t>& positions,
                        const RopeFrequencies& f, Tensor& q_mla) {
  rope(q, w_kc.dim(0), dn + dr, dn, positions, f);
  absorb_q(q, w_kc, dn, dr, q_mla);
}

}  // namespace mla
