// tools/tp_ranks.cpp — joining a tensor-parallel group from the command line (see tp_ranks.h).
#include "tp_ranks.h"

#include <cstdio>
#include <cstdlib>

#include "cli_util.h"
#include "mla/error.h"
#ifdef MLA_WITH_CUDA
#include "mla/nccl.h"
#endif

namespace mla::cli {
namespace {

std::vector<std::string>& argv_store() {
  static std::vector<std::string> v;
  return v;
}

// argv without the options the launcher gives each rank itself (--rank, --dist-init-addr).
std::vector<std::string> without_rank_options(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--rank" || a == "--dist-init-addr") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--rank=", 0) == 0 || a.rfind("--dist-init-addr=", 0) == 0) continue;
    out.push_back(a);
  }
  return out;
}

}  // namespace

void set_command_line(int argc, char** argv) { argv_store().assign(argv, argv + argc); }
const std::vector<std::string>& command_line() { return argv_store(); }

void TpFlags::add(CLI::App* sub) {
  sub->add_option("--tp", tp, "tensor-parallel ranks (one process and one GPU each)")->capture_default_str();
  sub->add_option("--nnodes", nnodes, "hosts of the tensor-parallel group")->capture_default_str();
  sub->add_option("--node-rank", node_rank, "this host's index among --nnodes")->capture_default_str();
  sub->add_option("--dist-init-addr", init_addr,
                  "host:port where rank 0 meets the others (default with one host: 127.0.0.1, a free port)");
  sub->add_flag("--tp-in-process", in_process,
                "the --tp ranks as threads of this process on one device (same sums as NCCL ranks; any TP size)");
  sub->add_option("--rank", rank, "this process's rank (given to the ranks mla starts)")->group("");
}

GroupOptions TpFlags::group() const {
  GroupOptions g;
  g.size = tp, g.nnodes = nnodes, g.node_rank = node_rank, g.init_addr = init_addr;
  try {
    if (tp < 1) fail("--tp must be at least 1 (got {})", tp);
    g.validate();
    if (rank >= tp) fail("--rank {} is outside the group of --tp {}", rank, tp);
    if (in_process && (nnodes > 1 || rank >= 0 || !init_addr.empty()))
      fail("--tp-in-process runs every rank in this process: no --nnodes, --rank or --dist-init-addr");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return g;
}

TpRank::TpRank(const TpFlags& f, Platform p, const std::vector<std::string>& argv) {
  const GroupOptions g = f.group();
  if (g.size == 1 || f.in_process) return;
  const bool gpu = p != Platform::CPU;
  // A GPU rank's device 0 is its own GPU: the host's GPUs rotated for each rank it starts.
  const int gpus = gpu ? platform_device_count(p) : -1;
  if (gpu && gpus < g.size / g.nnodes)
    fail("--tp {} needs {} GPUs on this host, {} has {}", g.size, g.size / g.nnodes, platform_name(p), gpus);
  if (f.rank >= 0) {  // started by a host's first rank, or by hand on another host
    group_ = f.rank == 0 ? Rendezvous::listen(g).accept() : RankGroup::connect(g, f.rank);
  } else {
    const int self = g.node_rank * (g.size / g.nnodes);  // this host's first rank
    const std::vector<std::string> args = without_rank_options(argv);
    if (self == 0) {
      Rendezvous r = Rendezvous::listen(g);
      children_ = std::make_unique<RankChildren>(spawn_local_ranks(args, g, 0, r.address(), gpu, gpus));
      group_ = r.accept();
    } else {
      children_ = std::make_unique<RankChildren>(spawn_local_ranks(args, g, self, g.init_addr, gpu, gpus));
      group_ = RankGroup::connect(g, self);
    }
  }
  group_->exit_when_peer_lost();
}

TpRank::~TpRank() {
  comm_.reset();
  group_.reset();  // leaves in order: the others do not count this rank as lost
  if (children_) children_->wait(10.0);
}

int TpRank::rank() const { return group_ ? group_->rank() : 0; }

Communicator& TpRank::communicator(Ops& ops) {
  if (!group_) fail("tensor parallelism: no group (--tp 1)");
  if (comm_) return *comm_;
  if (ops.platform() == Platform::CPU) {
    comm_ = group_->communicator(ops);
  } else {
#ifdef MLA_WITH_CUDA
    const std::string id = group_->broadcast(group_->rank() == 0 ? nccl_unique_id() : std::string());
    comm_ = nccl_communicator(group_->rank(), group_->size(), id, ops);
#else
    fail("tensor parallelism on {} needs a build with CUDA (NCCL)", platform_name(ops.platform()));
#endif
  }
  return *comm_;
}

}  // namespace mla::cli

namespace mla::cli {

ThreadRanks::ThreadRanks(int size, Follower follower) : group_(std::make_unique<InProcessGroup>(size)) {
  for (int r = 0; r < size; ++r) channels_.push_back(std::make_unique<Channel>());
  for (int r = 1; r < size; ++r)
    threads_.emplace_back([this, r, follower] {
      Channel& c = *channels_[size_t(r)];
      auto receive = [&c] {
        std::unique_lock<std::mutex> l(c.mu);
        c.cv.wait(l, [&] { return !c.q.empty(); });
        std::string m = std::move(c.q.front());
        c.q.pop_front();
        return m;
      };
      try {
        follower(r, *group_, receive);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "mla: tensor-parallel rank %d: %s; stopping\n", r, e.what());
        std::_Exit(3);  // as a lost rank process does
      }
    });
}

ThreadRanks::~ThreadRanks() {
  send(std::string());  // ends followers whose leader never led (rank 0 failed first); else unread
  for (std::thread& t : threads_) t.join();
}

Communicator& ThreadRanks::rank0(Ops& ops) {
  if (!comm0_) comm0_ = group_->communicator(0, ops);
  return *comm0_;
}

void ThreadRanks::send(const std::string& msg) {
  for (size_t r = 1; r < channels_.size(); ++r) {
    Channel& c = *channels_[r];
    std::lock_guard<std::mutex> l(c.mu);
    c.q.push_back(msg);
    c.cv.notify_one();
  }
}

}  // namespace mla::cli
