// mla/ranks.h — the processes of a tensor-parallel group: how N ranks (one process each) find each
// other over TCP, rank 0's control channel to the others, a Communicator over their sockets for host
// (CPU) tensors, starting a host's ranks as child processes, and ending every rank within about a
// second when one of them goes away (never a hang).
//
// Rank 0 listens (Rendezvous), the others connect to it (RankGroup::connect): the group is a star
// around rank 0. Each rank other than 0 holds three connections to rank 0: control (broadcast,
// all_gather, barrier), data (the communicator's collectives) and liveness (exit_when_peer_lost), so that each
// may be used by its own thread. Linux only (POSIX sockets, prctl).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mla/communicator.h"

namespace mla {

struct GroupOptions {
  int size = 1;           // ranks in all (--tp)
  int nnodes = 1;         // hosts; size % nnodes == 0; host k runs ranks [k·size/nnodes, (k+1)·size/nnodes)
  int node_rank = 0;      // this host
  std::string init_addr;  // "host:port" where rank 0 listens; empty: 127.0.0.1 and a free port (one host only)
  double timeout_s = 60;  // joining: how long to wait for the others
  // Liveness (exit_when_peer_lost): a watching peer that has sent nothing for this long is lost (its
  // host died or hangs without closing its connections). A process that ends is seen at once.
  double peer_timeout_s = 10;
  // Error naming the bad value: size < 1, nnodes < 1, size % nnodes, node_rank out of range,
  // nnodes > 1 without init_addr, a malformed host:port, a timeout that is not positive.
  void validate() const;
};
int local_rank(const GroupOptions& o, int rank);  // rank's index on its host
int node_of(const GroupOptions& o, int rank);     // the host that runs `rank`

class RankGroup;

// Rank 0's side of joining, in two steps so the launcher can start the others in between.
class Rendezvous {
 public:
  // Binds init_addr (or 127.0.0.1:0, a free port). With nnodes > 1 it listens on every interface at
  // init_addr's port (the host name is what the other hosts connect to). Error naming the address.
  static Rendezvous listen(const GroupOptions& o);
  Rendezvous(Rendezvous&&) noexcept;
  Rendezvous& operator=(Rendezvous&&) noexcept;
  ~Rendezvous();  // stops listening
  std::string address() const;  // "host:port" actually bound (the port chosen when init_addr was empty)
  // Waits for ranks 1..size-1 (timeout_s from this call): Error naming the missing ranks, or a rank
  // that says a different group size (that rank is refused too, with the same message). Each joined
  // rank's connect() returns only once the whole group has joined. Once only; it stops listening.
  std::unique_ptr<RankGroup> accept();

  struct Impl;

 private:
  explicit Rendezvous(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class RankGroup {
 public:
  // Ranks > 0: connects to rank 0 at o.init_addr, retrying until timeout_s, and returns once every
  // rank has joined. Error naming the address and the rank (unreachable, refused, timed out).
  static std::unique_ptr<RankGroup> connect(const GroupOptions& o, int rank);
  // Leaves the group in order: stops watching, tells the peers this rank leaves (so that their
  // watchdogs do not count it as lost), closes the connections. Destroy the group before a process
  // ends normally; a process that ends without doing so counts as lost for the others.
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int rank() const;
  int size() const;
  int pid_of(int rank) const;  // the process id each rank gave when joining

  // Control channel, rank 0 → everyone, in order: on rank 0 sends `msg` and returns it; elsewhere returns
  // rank 0's message (whatever `msg` was passed). Arbitrary bytes, any length. Error when rank 0 or a
  // peer is gone (or the ranks mix up broadcast, all_gather and barrier).
  std::string broadcast(const std::string& msg);
  // Every rank's `mine` (arbitrary bytes), indexed by rank, on every rank: what each rank must tell all
  // the others (its host, its GPU's id, a peer-memory handle). On the control channel, in order.
  std::vector<std::string> all_gather(const std::string& mine);
  void barrier();
  // A Communicator over these processes for tensors of a host platform (CPU Ops): same contract and
  // same bits as InProcessGroup (rank-order f32 sums through rank 0's Ops, one rounding). Every
  // disagreement (shapes, dtypes, roots, output sizes, a device tensor) fails on every rank with one
  // message and leaves the group usable; a broken connection fails every rank and leaves the group
  // broken (each later collective fails at once). All communicators of a group share one data
  // connection: use them from one thread at a time, in the same order on every rank.
  std::unique_ptr<Communicator> communicator(Ops& ops);
  // From now on, a peer that goes away (its process ends, its connection breaks) ends THIS process within
  // about a second, whatever its threads are blocked in (a collective, NCCL, a socket read): `on_lost`
  // gets a one-line reason ("rank 1 (pid 123) is gone: connection closed") and the default prints
  // "mla: tensor-parallel rank R: <reason>; stopping" on stderr and _exit(3)s. A watchdog thread on its
  // own liveness connection: it works while other threads use the group. Rank 0 passes a lost rank's
  // reason on to the others before stopping. Call it on every rank: the others hear of a rank's loss
  // through rank 0, and silence (GroupOptions::peer_timeout_s) counts only against a rank that watches
  // too (its watchdog sends the heartbeats). Once per group; with one rank there is nothing to watch.
  void exit_when_peer_lost(std::function<void(const std::string&)> on_lost = {});

  struct Links;  // the connections, shared with the group's communicators

 private:
  RankGroup(std::shared_ptr<Links> links);
  friend class Rendezvous;
  std::shared_ptr<Links> l_;
  struct Watchdog;
  std::unique_ptr<Watchdog> watch_;
};

// The children started by spawn_local_ranks. The reaper thread that watches them lives as long as this
// object: keep it for the life of the process.
struct ChildReaper;
struct RankChildren {
  std::vector<int> pids;   // one per child, in rank order
  std::vector<int> ranks;  // the rank of each child
  // Waits until every child has exited with status 0 (any other end stops this process first): true;
  // false when timeout_s passes first.
  bool wait(double timeout_s) const;
  std::shared_ptr<ChildReaper> reaper;
};

// Starts this host's ranks other than `self` as child processes: `argv` (program + arguments; the caller
// passes its own command line) with "--rank R --dist-init-addr ADDR" appended. Children: stdout to
// /dev/null (only rank 0 prints results), stderr shared; each child dies with its parent
// (prctl PR_SET_PDEATHSIG, SIGKILL: call this from the thread that lives as long as the process, the
// main thread, since the signal follows the forking thread); env CUDA_VISIBLE_DEVICES set per child to
// the host's GPU list rotated so that the child's own GPU (index local_rank) comes first when
// `rotate_gpus` (all GPUs stay visible for peer access; device 0 is the rank's own). The host's GPU
// list: the entries of an existing CUDA_VISIBLE_DEVICES, else 0..gpus-1; gpus = -1 (and no
// CUDA_VISIBLE_DEVICES), or an empty list: the variable is left alone. A reaper thread: a child that
// exits non-zero or by a signal ends this process with
// "mla: tensor-parallel rank R exited (status S)" or "(signal N)" + "; stopping" on stderr (_exit(3)).
// Error (no child left running) when the options are bad, `self` is not on this host, a rank has no
// GPU of its own in the list, or the program cannot be started.
RankChildren spawn_local_ranks(const std::vector<std::string>& argv, const GroupOptions& o, int self,
                               const std::string& addr, bool rotate_gpus, int gpus = -1);

}  // namespace mla
