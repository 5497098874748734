// The in-process communicator: ranks are threads of one process. A collective posts each rank's
// tensors, meets at a barrier, lets every rank combine what was posted through its own Ops (in rank
// order, f32 sums), and meets again before anyone may touch its inputs.
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "mla/communicator.h"
#include "mla/error.h"

namespace mla {

// A barrier that abort() breaks: every rank waiting in it, and every later arrival, fails.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(mu_);
    if (!broken_.empty()) fail("{}", broken_);
    const uint64_t gen = gen_;
    if (++waiting_ == n_) {
      waiting_ = 0, ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(l, [&] { return gen_ != gen || !broken_.empty(); });
    if (gen_ == gen) fail("{}", broken_);
  }
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> l(mu_);
    if (broken_.empty()) broken_ = why.empty() ? "aborted" : why;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  uint64_t gen_ = 0;
  std::string broken_;
};

struct InProcessGroup::State {
  explicit State(int n) : size(n), sync(n), posted(size_t(n)) {}
  const int size;
  Barrier sync;
  struct Post {
    const Tensor* in = nullptr;
    Tensor* out = nullptr;
    int root = 0;
  };
  std::vector<Post> posted;
};

namespace {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup::State> s, int rank, Ops& ops)
      : s_(std::move(s)), rank_(rank), ops_(ops) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  std::string name() const override { return fmt::format("in-process {}/{}", rank_, s_->size); }

  void all_reduce(Tensor& x) override {
    Tensor acc;  // written to x only once every rank has read every x
    meet("all_reduce", &x, &x, 0, [&] { acc = sum_slices(0, x.numel()); }, [&] { ops_.copy(acc, x); });
  }
  void all_gather(const Tensor& x, Tensor& out) override {
    if (out.numel() != x.numel() * s_->size)
      fail("{}: all_gather of {} elements needs an output of {}, got {}", name(), x.numel(), x.numel() * s_->size,
           out.numel());
    meet("all_gather", &x, &out, 0, [&] {
      Tensor parts = out.reshaped({s_->size, x.numel()});
      for (int r = 0; r < s_->size; ++r) {
        Tensor dst = parts.rows(r, r + 1);
        ops_.copy(*s_->posted[size_t(r)].in, dst);
      }
    });
  }
  void reduce_scatter(const Tensor& x, Tensor& out) override {
    if (x.numel() != out.numel() * s_->size)
      fail("{}: reduce_scatter of {} elements over {} ranks needs an output of {}, got {}", name(), x.numel(),
           s_->size, x.numel() / s_->size, out.numel());
    meet("reduce_scatter", &x, &out, 0, [&] {
      Tensor acc = sum_slices(int64_t(rank_) * out.numel(), out.numel());
      ops_.copy(acc, out);
    });
  }
  void broadcast(Tensor& x, int root) override {
    if (root < 0 || root >= s_->size) fail("{}: broadcast root {} is outside the {} ranks", name(), root, s_->size);
    meet("broadcast", &x, &x, root, [&] {
      if (rank_ != root) ops_.copy(*s_->posted[size_t(root)].in, x);
    });
  }

 private:
  // Every rank's input elements [begin, begin + n), summed in f32 in rank order.
  Tensor sum_slices(int64_t begin, int64_t n) {
    Tensor acc = ops_.empty(DType::F32, {n});
    for (int r = 0; r < s_->size; ++r) {  // rank order
      const Tensor& in = *s_->posted[size_t(r)].in;
      const Tensor part = in.reshaped({in.numel(), 1}).rows(begin, begin + n);  // [n, 1]
      if (r == 0) ops_.copy(part, acc);
      else ops_.add(acc, part);
    }
    return acc;
  }

  // Posts this rank's tensors, waits for every rank, checks that all agree (each rank throws the same
  // error, after the second barrier), combines, waits again, then finishes (writes its inputs).
  template <typename F, typename G = void (*)()>
  void meet(const char* what, const Tensor* in, Tensor* out, int root, F combine, G finish = [] {}) {
    ops_.synchronize();  // this rank's input is complete before others read it
    s_->posted[size_t(rank_)] = {in, out, root};
    s_->sync.arrive_and_wait();
    std::string bad;
    const State::Post& p0 = s_->posted[0];
    for (int r = 1; r < s_->size && bad.empty(); ++r) {
      const State::Post& p = s_->posted[size_t(r)];
      if (p.in->shape() != p0.in->shape() || p.in->dtype() != p0.in->dtype() || p.root != p0.root)
        bad = fmt::format("{}: rank {} gave {} {} (root {}), rank 0 {} {} (root {})", what, r, dtype_name(p.in->dtype()),
                          shape_str(p.in->shape()), p.root, dtype_name(p0.in->dtype()), shape_str(p0.in->shape()),
                          p0.root);
    }
    if (bad.empty()) {
      combine();
      ops_.synchronize();
    }
    s_->sync.arrive_and_wait();  // every rank has read the inputs (or seen the disagreement)
    if (!bad.empty()) fail("{}: {}", name(), bad);
    finish();
    ops_.synchronize();
  }
  using State = InProcessGroup::State;

  std::shared_ptr<State> s_;
  int rank_;
  Ops& ops_;
};

}  // namespace

InProcessGroup::InProcessGroup(int size) {
  if (size < 1) fail("in-process group: size must be at least 1 (got {})", size);
  s_ = std::make_shared<State>(size);
}
InProcessGroup::~InProcessGroup() = default;
int InProcessGroup::size() const { return s_->size; }
void InProcessGroup::abort(const std::string& reason) {
  s_->sync.abort(fmt::format("in-process group: {}", reason));
}

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank, Ops& ops) {
  if (rank < 0 || rank >= s_->size) fail("in-process group: rank {} is outside [0, {})", rank, s_->size);
  return std::make_unique<InProcessCommunicator>(s_, rank, ops);
}

}  // namespace mla
