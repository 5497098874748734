// ranks_spawn.cpp — starting a host's other ranks as child processes, and the reaper thread that
// stops this process when one of them fails.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "mla/error.h"
#include "mla/ranks.h"
#include "socket_io.h"

extern char** environ;

namespace mla {

struct ChildReaper {
  std::vector<int> pids, ranks;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  size_t exited = 0;  // children that ended with status 0
  std::thread thread;

  ~ChildReaper() {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }

  void run() {
    std::vector<bool> done(pids.size(), false);
    std::unique_lock lock(mu);
    while (!stop && exited < pids.size()) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        int st = 0;
        const pid_t r = ::waitpid(pids[i], &st, WNOHANG);
        if (r < 0 && errno == ECHILD) {  // reaped elsewhere (SIGCHLD ignored): its status is lost
          done[i] = true;
          ++exited;
          continue;
        }
        if (r != pids[i]) continue;  // still running
        done[i] = true;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
          ++exited;
          continue;
        }
        const std::string how = WIFSIGNALED(st) ? fmt::format("signal {}", WTERMSIG(st))
                                                : fmt::format("status {}", WEXITSTATUS(st));
        std::fprintf(stderr, "mla: tensor-parallel rank %d exited (%s); stopping\n", ranks[i], how.c_str());
        std::fflush(stderr);
        ::_exit(3);
      }
      cv.notify_all();
      cv.wait_for(lock, std::chrono::milliseconds(50));
    }
    cv.notify_all();
  }
};

bool RankChildren::wait(double timeout_s) const {
  if (!reaper) return pids.empty();
  std::unique_lock lock(reaper->mu);
  return reaper->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                             [&] { return reaper->exited == reaper->pids.size(); });
}

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> v;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find(',', b);
    v.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return v;
}

// The program's path: as given when it has a '/', else the first executable of that name on PATH.
std::string find_program(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  const std::string p = path ? path : "/usr/bin:/bin";
  size_t b = 0;
  for (;;) {
    const size_t e = p.find(':', b);
    std::string dir = p.substr(b, e == std::string::npos ? std::string::npos : e - b);
    const std::string cand = (dir.empty() ? "." : dir) + "/" + prog;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    if (e == std::string::npos) break;
    b = e + 1;
  }
  fail("spawn_local_ranks: program '{}' is not on PATH", prog);
}

}  // namespace

RankChildren spawn_local_ranks(const std::vector<std::string>& argv, const GroupOptions& o, int self,
                               const std::string& addr, bool rotate_gpus, int gpus) {
  o.validate();
  if (argv.empty()) fail("spawn_local_ranks: no program to start");
  const int per = o.size / o.nnodes, first = o.node_rank * per;
  if (self < first || self >= first + per)
    fail("spawn_local_ranks: rank {} does not run on host {} (ranks {}..{})", self, o.node_rank, first, first + per - 1);
  if (!net::parse_host_port(addr)) fail("spawn_local_ranks: rank 0's address '{}' is not host:port", addr);
  // The host's GPUs, each child's list rotated to start at its own.
  std::vector<std::string> gpu_list;
  bool set_gpus = false;
  if (rotate_gpus) {
    if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
      if (*cvd) gpu_list = split_commas(cvd);
    } else if (gpus > 0) {
      for (int i = 0; i < gpus; ++i) gpu_list.push_back(std::to_string(i));
    }
    set_gpus = !gpu_list.empty();
    if (set_gpus && int(gpu_list.size()) < per)
      fail("spawn_local_ranks: {} ranks on this host, but only {} GPUs ({})", per, gpu_list.size(),
           std::getenv("CUDA_VISIBLE_DEVICES") ? "CUDA_VISIBLE_DEVICES" : "gpus");
  }
  const std::string path = find_program(argv[0]);

  auto reaper = std::make_shared<ChildReaper>();
  auto kill_started = [&] {
    for (int pid : reaper->pids) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  };
  const pid_t parent = ::getpid();
  for (int r = first; r < first + per; ++r) {
    if (r == self) continue;
    // Everything the child needs is built before fork (only async-signal-safe calls after it).
    std::vector<std::string> args = argv;
    for (std::string a : {std::string("--rank"), std::to_string(r), std::string("--dist-init-addr"), addr}) args.push_back(a);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (!set_gpus || std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0) env.push_back(*e);
    if (set_gpus) {
      const int lr = local_rank(o, r);
      std::string v;
      for (size_t i = 0; i < gpu_list.size(); ++i)
        v += (i ? "," : "") + gpu_list[(size_t(lr) + i) % gpu_list.size()];
      env.push_back("CUDA_VISIBLE_DEVICES=" + v);
    }
    std::vector<char*> cargs, cenv;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    for (std::string& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    int errpipe[2];  // the child's exec error, if any (closed by a successful exec)
    if (::pipe2(errpipe, O_CLOEXEC) != 0) {
      const int err = errno;
      kill_started();
      fail("spawn_local_ranks: pipe: {}", net::errno_str(err));
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(errpipe[0]);
      ::close(errpipe[1]);
      kill_started();
      fail("spawn_local_ranks: cannot start rank {}: fork: {}", r, net::errno_str(err));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(3);  // the parent is gone already
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0 && devnull != STDOUT_FILENO) {
        ::dup2(devnull, STDOUT_FILENO);
        ::close(devnull);
      }
      ::execve(path.c_str(), cargs.data(), cenv.data());
      const int err = errno;
      [[maybe_unused]] ssize_t k = ::write(errpipe[1], &err, sizeof err);
      ::_exit(127);
    }
    ::close(errpipe[1]);
    int err = 0;
    ssize_t k;
    do k = ::read(errpipe[0], &err, sizeof err);
    while (k < 0 && errno == EINTR);
    ::close(errpipe[0]);
    if (k > 0) {
      ::waitpid(pid, nullptr, 0);
      kill_started();
      fail("spawn_local_ranks: cannot start rank {}: {}: {}", r, path, net::errno_str(err));
    }
    reaper->pids.push_back(pid);
    reaper->ranks.push_back(r);
  }
  RankChildren c;
  c.pids = reaper->pids;
  c.ranks = reaper->ranks;
  ChildReaper* rp = reaper.get();
  reaper->thread = std::thread([rp] { rp->run(); });
  c.reaper = std::move(reaper);
  return c;
}

}  // namespace mla
