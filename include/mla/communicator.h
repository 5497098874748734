// mla/communicator.h — collectives among the ranks of a tensor-parallel group, beside Ops: every
// rank calls the same collectives in the same order, on tensors of its own platform. A collective
// whose ranks disagree on a shape fails on every rank (none waits for ever).
#pragma once
#include <memory>
#include <string>

#include "mla/ops.h"
#include "mla/tensor.h"

namespace mla {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "in-process 2/4"
  // Whether its collectives may be recorded in a step graph (Ops::begin_capture) and replayed: no
  // host work per call. The in-process and socket communicators meet on the host: no.
  virtual bool capturable() const { return false; }
  // Throws the failure a collective recorded on the device (a disagreement, a lost rank) since
  // the last call: replayed collectives run no host code, so the model asks after a replay.
  virtual void check() {}

  // x ← Σ_r x_r, the same on every rank. Ours (in-process, the one-shot kernels) sum in f32 in
  // rank order 0, 1, …, size−1 and round once to x's dtype: deterministic, the same bits on
  // every rank and every run.
  virtual void all_reduce(Tensor& x) = 0;
  // out[size · n] ← x_0 ‖ x_1 ‖ … (each x_r of n elements), in rank order
  virtual void all_gather(const Tensor& x, Tensor& out) = 0;
  // x[size · m] on every rank → out[m] = (Σ_r x_r)[rank · m, (rank + 1) · m), summed as all_reduce
  virtual void reduce_scatter(const Tensor& x, Tensor& out) = 0;
  // x ← x of rank `root`
  virtual void broadcast(Tensor& x, int root) = 0;

  // The residual step after a row-parallel layer: y ← Σ_r y_r (as all_reduce), then h += y and
  // x ← RMSNorm(h)·w (Ops::add_rmsnorm) on `ops`, this rank's platform. A communicator with its
  // own kernels may fuse the three; the result is the same bits as all_reduce then add_rmsnorm.
  virtual void all_reduce_add_rmsnorm(Tensor& y, Tensor& h, Tensor& x, const Tensor& w, double eps, Ops& ops) {
    all_reduce(y);
    ops.add_rmsnorm(h, y, x, w, eps);
  }
};

// `size` ranks in one process, one thread each, sharing one platform's memory (the CPU or one GPU):
// the sharded math runs and is tested without several devices, at any TP size (NCCL refuses two
// ranks on one GPU). Collectives meet at a barrier and combine through each rank's own Ops.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;
  int size() const;
  // A rank that cannot go on (its thread failed): every rank waiting in a collective, and every
  // later collective, fails with "in-process group: <reason>" instead of waiting for it.
  void abort(const std::string& reason);
  // The communicator of `rank`, combining through `ops` (used by that rank's thread only).
  std::unique_ptr<Communicator> communicator(int rank, Ops& ops);

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace mla
