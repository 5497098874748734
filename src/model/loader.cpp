// Loading a model: from an HF checkpoint folder (memory-mapped, converted on many threads, uploaded
// through page-locked staging buffers) or with random weights generated on the platform.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "mla/error.h"
#include "mla/model.h"
#include "mla/safetensors.h"

namespace mla {
namespace {

using Clock = std::chrono::steady_clock;

// Counts what has been filled and reports it.
class Progress {
 public:
  explicit Progress(const LoadOptions& opt) : fn_(opt.progress) {}
  void begin(int64_t tensors, int64_t bytes) {
    p_ = {0, tensors, 0, bytes, 0};
    t0_ = Clock::now();
  }
  void done(const Tensor& t) {
    ++p_.tensors;
    p_.bytes += int64_t(t.nbytes());
    p_.seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
    if (fn_) fn_(p_);
  }

 private:
  std::function<void(const LoadProgress&)> fn_;
  LoadProgress p_;
  Clock::time_point t0_;
};

int thread_count(const LoadOptions& opt) {
  return opt.threads > 0 ? opt.threads : std::max(1, int(std::thread::hardware_concurrency()));
}

// dst[0, n) = src[0, n) converted, split over up to `threads` threads (at least 1M elements each).
void convert_parallel(const void* src, DType from, void* dst, DType to, size_t n, int threads) {
  const size_t parts = std::clamp<size_t>(n / (size_t(1) << 20), 1, size_t(threads));
  if (parts == 1) return convert_elements(src, from, dst, to, n);
  std::vector<std::thread> pool;
  for (size_t k = 0; k < parts; ++k) {
    const size_t b = n * k / parts, e = n * (k + 1) / parts;
    pool.emplace_back([=] {
      convert_elements(static_cast<const char*>(src) + b * dtype_size(from), from,
                       static_cast<char*>(dst) + b * dtype_size(to), to, e - b);
    });
  }
  for (std::thread& t : pool) t.join();
}

// The shard of a host tensor: a row slice is a view of it, a column slice a copy (row by row).
Tensor host_shard(const Tensor& w, const WeightShard& shard, const Shape& part) {
  if (shard.whole()) return w;
  if (shard.dim == 0) return w.rows(shard.start, shard.start + part[0]);
  Tensor out = Tensor::host(w.dtype(), part);  // [rows, n] of w's [rows, full]
  const size_t es = dtype_size(w.dtype()), n = size_t(part[1]) * es, ld = size_t(shard.full) * es;
  const char* src = static_cast<const char*>(w.data()) + size_t(shard.start) * es;
  char* dst = static_cast<char*>(out.data());
  for (int64_t r = 0; r < part[0]; ++r) std::memcpy(dst + size_t(r) * n, src + size_t(r) * ld, n);
  return out;
}

// Tensors of a checkpoint: each goes from the mapping to the platform dtype in 64 MB pieces, each
// piece converted into one of three page-locked buffers while the previous pieces are copied.
class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(const Checkpoint& ck, Ops& ops, const LoadOptions& opt)
      : ck_(ck), ops_(ops), progress_(opt), threads_(thread_count(opt)), piece_bytes_(opt.staging_bytes) {
    if (piece_bytes_ < 64) fail("load: staging buffers of {} bytes are too small (64 at least)", piece_bytes_);
  }

  bool has(const std::string& name) const override { return ck_.has(name); }
  void begin(int64_t tensors, int64_t bytes) override { progress_.begin(tensors, bytes); }
  void fill(const std::string& name, Tensor& dst, const WeightShard& shard) override {
    const std::optional<Tensor> t = ck_.has(name) ? std::optional<Tensor>(ck_.view(name)) : std::nullopt;
    const Shape full = shard.full_shape(dst.shape());
    const Tensor& w = check_weight(t, name, full);
    used_.insert(name);
    if (is_fp8(w.dtype())) {
      used_.insert(name + "_scale_inv");
      TensorLookup get = [&](const std::string& n) { return ck_.find(n); };
      put(host_shard(load_weight(get, name, full, DType::F32), shard, dst.shape()), dst);  // dequantized on the host
    } else {
      put(host_shard(w, shard, dst.shape()), dst);
    }
    progress_.done(dst);
  }
  void end() override { ops_.synchronize(); }

  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const std::string& n : ck_.names())
      if (!used_.count(n)) out.push_back(n);
    return out;
  }

 private:
  static constexpr int kBuffers = 3;

  void put(const Tensor& src, Tensor& dst) {
    const size_t n = size_t(dst.numel()), es = dtype_size(dst.dtype()), ses = dtype_size(src.dtype());
    if (staging_.empty())
      for (int i = 0; i < kBuffers; ++i) staging_.push_back(ops_.alloc_staging(piece_bytes_));
    const size_t piece = piece_bytes_ / es;
    for (size_t i = 0; i < n; i += piece) {
      const size_t m = std::min(piece, n - i);
      const int slot = int(next_++ % kBuffers);
      ops_.wait_upload(slot);  // the buffer's previous copy has landed
      convert_parallel(static_cast<const char*>(src.data()) + i * ses, src.dtype(), staging_[size_t(slot)].get(),
                       dst.dtype(), m, threads_);
      ops_.upload_async(staging_[size_t(slot)].get(), dst, i * es, m * es, slot);
    }
  }

  const Checkpoint& ck_;
  Ops& ops_;
  Progress progress_;
  int threads_;
  size_t piece_bytes_;
  std::set<std::string> used_;
  std::vector<std::shared_ptr<void>> staging_;
  uint64_t next_ = 0;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Weights as transformers initializes DeepSeek models: projections and embeddings with std
// initializer_range, RMSNorm weights 1, the router's correction bias 0; made on the platform.
class RandomSource final : public WeightSource {
 public:
  RandomSource(Ops& ops, uint64_t seed, double std, const LoadOptions& opt)
      : ops_(ops), seed_(seed), std_(std), progress_(opt) {}
  bool has(const std::string&) const override { return true; }
  void begin(int64_t tensors, int64_t bytes) override { progress_.begin(tensors, bytes); }
  void fill(const std::string& name, Tensor& dst, const WeightShard& shard) override {
    if (ends_with(name, "layernorm.weight") || name == "model.norm.weight") ops_.fill(dst, 1.0);
    else if (ends_with(name, "e_score_correction_bias")) ops_.fill(dst, 0.0);
    else if (shard.whole()) ops_.fill_random(dst, seed_ ^ fnv1a(name), std_);
    else fill_shard(name, dst, shard);
    progress_.done(dst);
  }
  void end() override { ops_.synchronize(); }

 private:
  // Values are indexed in the whole tensor: made whole on the platform, then the slice is kept.
  void fill_shard(const std::string& name, Tensor& dst, const WeightShard& shard) {
    Tensor whole = ops_.empty(dst.dtype(), shard.full_shape(dst.shape()));
    ops_.fill_random(whole, seed_ ^ fnv1a(name), std_);
    if (shard.dim == 0) ops_.copy(whole.rows(shard.start, shard.start + dst.dim(0)), dst);
    else ops_.take_cols(whole, shard.start, dst);
  }

  Ops& ops_;
  uint64_t seed_;
  double std_;
  Progress progress_;
};

}  // namespace

LoadedModel load_model(const std::string& dir, Ops& ops, const LoadOptions& opt) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) fail("model folder '{}' does not exist", dir);
  LoadedModel m;
  m.config = load_model_config(dir);
  const Checkpoint ck = Checkpoint::open(dir);
  CheckpointSource src(ck, ops, opt);
  const auto t0 = Clock::now();
  m.model = std::make_unique<Model>(m.config, src, ops, opt.tp);
  m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  m.unused = src.unused();
  return m;
}

LoadedModel random_model(const ModelConfig& c, Ops& ops, uint64_t seed, const LoadOptions& opt) {
  LoadedModel m;
  m.config = c;
  RandomSource src(ops, seed, c.initializer_range, opt);
  const auto t0 = Clock::now();
  m.model = std::make_unique<Model>(c, src, ops, opt.tp);
  m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return m;
}

}  // namespace mla
