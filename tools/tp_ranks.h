// tools/tp_ranks.h — `--tp N`: the ranks of a tensor-parallel run. The process the user starts is
// rank 0 (with --nnodes, the one on host 0); it starts its host's other ranks as copies of itself
// (same arguments plus --rank and --dist-init-addr). Every rank loads its shard; rank 0 runs the
// command and its engine leads; the others follow that engine and end with it. A rank that dies
// ends the others within seconds, with a message naming it.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "mla/communicator.h"
#include "mla/platform.h"
#include "mla/ranks.h"

namespace mla::cli {

// The options every model command takes for tensor parallelism.
struct TpFlags {
  int tp = 1, nnodes = 1, node_rank = 0;
  int rank = -1;  // given to the ranks the launcher starts; -1: this host's first rank
  std::string init_addr;
  bool in_process = false;  // the ranks as threads of this process on one device (InProcessGroup)
  void add(CLI::App* sub);
  GroupOptions group() const;  // usage errors naming the bad value
};

// This process's place in the group (an empty one with --tp 1).
class TpRank {
 public:
  TpRank() = default;
  // Joins the group; the host's first rank starts the host's others first. Call before any GPU is
  // touched; the program's own command line is `argv`.
  TpRank(const TpFlags& f, Platform p, const std::vector<std::string>& argv);
  ~TpRank();  // waits (a few seconds) for the ranks it started, after leaving the group
  TpRank(TpRank&&) = default;
  TpRank& operator=(TpRank&&) = default;

  bool active() const { return group_ != nullptr; }
  int rank() const;
  // The communicator of this rank on `ops`: NCCL (with our NVLink all-reduce) on a GPU platform,
  // the group's sockets on the CPU. Made once; the rank keeps it.
  Communicator& communicator(Ops& ops);
  RankGroup& group() { return *group_; }

 private:
  std::unique_ptr<RankGroup> group_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<RankChildren> children_;
};

// --tp N --tp-in-process: ranks 1 … N−1 as threads of this process on rank 0's device, combining
// through the in-process communicator (the same sums as our NCCL kernels: the bits of a real TP N
// run, and TP sizes past the GPUs present). Each thread runs `follower(rank, group, receive)`: makes
// its Ops and its communicator (group.communicator(rank, ops)), loads its shard and follows rank 0's
// engine. A follower that fails stops the process
// (exit 3), as a lost rank does.
class ThreadRanks {
 public:
  using Follower = std::function<void(int rank, InProcessGroup& group, const std::function<std::string()>& receive)>;
  ThreadRanks(int size, Follower follower);
  ~ThreadRanks();  // ends and joins the threads (rank 0's engine, if any, is gone by then)
  Communicator& rank0(Ops& ops);  // rank 0's communicator, on its Ops
  void send(const std::string& msg);  // rank 0's engine → every follower

 private:
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> q;
  };
  std::unique_ptr<InProcessGroup> group_;
  std::unique_ptr<Communicator> comm0_;
  std::vector<std::unique_ptr<Channel>> channels_;  // [rank]; 0 unused
  std::vector<std::thread> threads_;
};

// Thrown on the ranks other than 0 when rank 0's engine has ended: the command is over for them
// (main returns 0).
struct RankFinished {};

// The program's command line, as main received it (for starting the other ranks).
void set_command_line(int argc, char** argv);
const std::vector<std::string>& command_line();

}  // namespace mla::cli
