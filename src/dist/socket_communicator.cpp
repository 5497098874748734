// socket_communicator.cpp — collectives among the processes of a RankGroup, for host (CPU) tensors,
// through rank 0 over the data connections. Every rank sends rank 0 a header (the collective, its
// tensor's dtype and shape, the root, its output's dtype and size, or what is wrong locally) and its
// input; rank 0 checks that all agree, combines through its own Ops exactly as the in-process group
// does (f32 sums in rank order, rounded once), and answers each rank: the result, or the one message
// every rank fails with. A disagreement consumes every message, so the group stays usable.
//
// Data frames: header 'P' (rank → 0) followed by the input's bytes; answer 'R' + result bytes, 'E' +
// the message of a disagreement, or 'X' + why the group broke (a connection failed).
#include <sys/socket.h>

#include <cstring>

#include "mla/error.h"
#include "mla/ranks.h"
#include "socket_io.h"

namespace mla {

using net::IoError;

namespace {

constexpr uint64_t kMaxHeader = 1 << 20;  // a header or an error message; more is a broken stream

enum class Op : uint8_t { AllReduce, AllGather, ReduceScatter, Broadcast };
const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::AllGather: return "all_gather";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::Broadcast: return "broadcast";
  }
  return "?";
}

// One rank's side of a collective.
struct Post {
  Op op = Op::AllReduce;
  DType dtype = DType::F32, out_dtype = DType::F32;
  Shape shape;
  int32_t root = 0;
  int64_t out_numel = 0;
  std::string local_error;  // what this rank found wrong before sending anything
  uint64_t payload = 0;     // input bytes following the header

  std::string encode() const {
    net::Writer w;
    w.put<uint8_t>(uint8_t(op)).put<uint8_t>(uint8_t(dtype)).put<uint8_t>(uint8_t(out_dtype)).put<int32_t>(root);
    w.put<int64_t>(out_numel).put<uint32_t>(uint32_t(shape.size()));
    for (int64_t d : shape) w.put<int64_t>(d);
    w.str(local_error).put<uint64_t>(payload);
    return w.s;
  }
  static Post decode(const std::string& s) {
    net::Reader r{s};
    Post p;
    p.op = Op(r.get<uint8_t>());
    p.dtype = DType(r.get<uint8_t>());
    p.out_dtype = DType(r.get<uint8_t>());
    p.root = r.get<int32_t>();
    p.out_numel = r.get<int64_t>();
    const uint32_t nd = r.get<uint32_t>();
    if (nd > 64) throw IoError("a malformed collective header");
    for (uint32_t i = 0; i < nd; ++i) p.shape.push_back(r.get<int64_t>());
    p.local_error = r.str();
    p.payload = r.get<uint64_t>();
    return p;
  }
};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

class SocketCommunicator final : public Communicator {
 public:
  SocketCommunicator(std::shared_ptr<RankGroup::Links> l, Ops& ops) : l_(std::move(l)), ops_(ops) {}
  int rank() const override { return l_->rank; }
  int size() const override { return l_->size; }
  std::string name() const override { return fmt::format("socket {}/{}", l_->rank, l_->size); }

  void all_reduce(Tensor& x) override { run(Op::AllReduce, x, &x, 0); }
  void all_gather(const Tensor& x, Tensor& out) override { run(Op::AllGather, x, &out, 0); }
  void reduce_scatter(const Tensor& x, Tensor& out) override { run(Op::ReduceScatter, x, &out, 0); }
  void broadcast(Tensor& x, int root) override { run(Op::Broadcast, x, &x, root); }

 private:
  // What is wrong with this rank's call on its own (empty: nothing).
  std::string check(Op op, const Tensor& x, const Tensor& out, int root) const {
    if (!x.defined() || !out.defined()) return "an undefined tensor";
    if (x.platform() != Platform::CPU || out.platform() != Platform::CPU)
      return fmt::format("a tensor on {}; this communicator takes host (cpu) tensors",
                         platform_name(x.platform() != Platform::CPU ? x.platform() : out.platform()));
    const int n = l_->size;
    if (op == Op::AllGather && out.numel() != x.numel() * n)
      return fmt::format("all_gather of {} elements needs an output of {}, got {}", x.numel(), x.numel() * n,
                         out.numel());
    if (op == Op::ReduceScatter && x.numel() != out.numel() * n)
      return fmt::format("reduce_scatter of {} elements over {} ranks needs an output of {}, got {}", x.numel(), n,
                         x.numel() / n, out.numel());
    if (op == Op::Broadcast && (root < 0 || root >= n))
      return fmt::format("broadcast root {} is outside the {} ranks", root, n);
    return "";
  }

  void run(Op op, const Tensor& x, Tensor* out, int root) {
    std::lock_guard lock(l_->data_mu);
    if (!l_->broken.empty()) fail("{}: {}: the group is broken: {}", name(), op_name(op), l_->broken);
    ops_.synchronize();  // this rank's input is complete
    Post p;
    p.op = op;
    p.root = root;
    p.local_error = check(op, x, *out, root);
    if (p.local_error.empty()) {
      p.dtype = x.dtype();
      p.shape = x.shape();
      p.out_dtype = out->dtype();
      p.out_numel = out->numel();
      const bool sends = op != Op::Broadcast || root == l_->rank;
      p.payload = sends ? x.nbytes() : 0;
    }
    if (l_->rank == 0) lead(p, x, *out);
    else follow(p, x, *out);
  }

  // Rank r > 0: send, then take rank 0's answer.
  void follow(const Post& p, const Tensor& x, Tensor& out) {
    const int fd = l_->data[0].get();
    std::string answer_error;
    try {
      net::send_frame(fd, 'P', p.encode());
      if (p.payload) net::send_all(fd, x.data(), p.payload);
      const net::FrameHeader f = net::recv_frame_header(fd);
      if ((f.type == 'E' || f.type == 'X') && f.length > kMaxHeader) throw IoError("a malformed answer");
      if (f.type == 'E') {
        answer_error = net::recv_body(fd, f.length);
      } else if (f.type == 'X') {
        l_->broken = net::recv_body(fd, f.length);
        answer_error = fmt::format("{}: the group broke: {}", op_name(p.op), l_->broken);
      } else {
        if (f.type != 'R') throw IoError("a malformed answer");
        receive_result(p, f.length, out, fd);
      }
    } catch (const IoError& e) {
      l_->broken = fmt::format("{}: {}", l_->who(0), e.what());
      fail("{}: {}: the group broke: {}", name(), op_name(p.op), l_->broken);
    }
    if (!answer_error.empty()) fail("{}: {}", name(), answer_error);
    ops_.synchronize();
  }

  // The result bytes rank 0 sent, into `out` (converted when it is an all_gather into another dtype).
  void receive_result(const Post& p, uint64_t length, Tensor& out, int fd) {
    uint64_t want = 0;
    Tensor into = out;
    switch (p.op) {
      case Op::AllReduce:
      case Op::ReduceScatter: want = out.nbytes(); break;
      case Op::Broadcast: want = l_->rank == p.root ? 0 : out.nbytes(); break;
      case Op::AllGather:
        want = uint64_t(out.numel()) * dtype_size(p.dtype);
        if (out.dtype() != p.dtype) into = Tensor::host(p.dtype, {out.numel()});
        break;
    }
    if (length != want) throw IoError(fmt::format("an answer of {} bytes where {} were due", length, want));
    if (want) net::recv_all(fd, into.data(), want);
    if (into.data() != out.data()) ops_.copy(into, out);
  }

  // Rank 0: every rank's post and input, the checks, the combination, the answers.
  void lead(const Post& p0, const Tensor& x, Tensor& out) {
    const int n = l_->size;
    std::vector<Post> posts(static_cast<size_t>(n));
    std::vector<Tensor> inputs(static_cast<size_t>(n));
    posts[0] = p0;
    // The inputs that take part: every rank's (a broadcast: the root's), empty tensors included.
    auto takes_part = [&](const Post& q, int rank) {
      return q.local_error.empty() && (q.op != Op::Broadcast || q.root == rank);
    };
    if (takes_part(p0, 0)) inputs[0] = x.reshaped({x.numel()});
    int r = 1;
    try {
      for (; r < n; ++r) {
        const int fd = l_->data[size_t(r)].get();
        const net::FrameHeader f = net::recv_frame_header(fd);
        if (f.type != 'P' || f.length > kMaxHeader) throw IoError("a malformed collective header");
        Post& q = posts[size_t(r)] = Post::decode(net::recv_body(fd, f.length));
        if (takes_part(q, r)) {
          if (q.payload != uint64_t(numel_of(q.shape)) * dtype_size(q.dtype))
            throw IoError("a malformed collective header");
          inputs[size_t(r)] = Tensor::host(q.dtype, {numel_of(q.shape)});
          if (q.payload) net::recv_all(fd, inputs[size_t(r)].data(), q.payload);
        } else if (q.payload) {
          throw IoError("a malformed collective header");
        }
      }
    } catch (const IoError& e) {
      break_group(fmt::format("{}: {}", l_->who(r), e.what()));
      fail("{}: {}: the group broke: {}", name(), op_name(p0.op), l_->broken);
    }
    // The one message every rank fails with: what a rank found wrong, or the first disagreement.
    std::string bad;
    for (int q = 0; q < n && bad.empty(); ++q)
      if (!posts[size_t(q)].local_error.empty())
        bad = fmt::format("{}: rank {}: {}", op_name(posts[size_t(q)].op), q, posts[size_t(q)].local_error);
    for (int q = 1; q < n && bad.empty(); ++q) {
      const Post& a = posts[size_t(q)];
      if (a.op != p0.op)
        bad = fmt::format("{}: rank {} called {}", op_name(p0.op), q, op_name(a.op));
      else if (a.shape != p0.shape || a.dtype != p0.dtype || a.root != p0.root)
        bad = fmt::format("{}: rank {} gave {} {} (root {}), rank 0 {} {} (root {})", op_name(p0.op), q,
                          dtype_name(a.dtype), shape_str(a.shape), a.root, dtype_name(p0.dtype), shape_str(p0.shape),
                          p0.root);
    }
    try {
      if (!bad.empty()) {
        for (int q = 1; q < n; ++q) net::send_frame(l_->data[size_t(q)].get(), 'E', bad);
      } else {
        combine(posts, inputs, x, out);
      }
    } catch (const IoError& e) {
      break_group(fmt::format("answering: {}", e.what()));
      fail("{}: {}: the group broke: {}", name(), op_name(p0.op), l_->broken);
    }
    if (!bad.empty()) fail("{}: {}", name(), bad);
    ops_.synchronize();
  }

  void combine(const std::vector<Post>& posts, const std::vector<Tensor>& inputs, const Tensor& x, Tensor& out) {
    const int n = l_->size;
    const Post& p0 = posts[0];
    auto answer = [&](int q, const Tensor& t) {
      const int fd = l_->data[size_t(q)].get();
      net::send_frame_header(fd, 'R', t.nbytes());
      if (t.nbytes()) net::send_all(fd, t.data(), t.nbytes());
    };
    switch (p0.op) {
      case Op::AllReduce: {
        Tensor acc = sum(inputs);  // written to x only once every input was read
        ops_.copy(acc, out);
        ops_.synchronize();
        for (int q = 1; q < n; ++q) answer(q, x);
        break;
      }
      case Op::AllGather: {
        const int64_t m = x.numel();
        Tensor cat = Tensor::host(p0.dtype, {n, m});
        for (int q = 0; q < n; ++q)
          if (m) std::memcpy(static_cast<char*>(cat.data()) + size_t(q) * inputs[size_t(q)].nbytes(),
                             inputs[size_t(q)].data(), inputs[size_t(q)].nbytes());
        for (int q = 1; q < n; ++q) answer(q, cat);
        ops_.copy(cat, out);
        break;
      }
      case Op::ReduceScatter: {
        Tensor acc = sum(inputs);
        const int64_t m = x.numel() / n;
        const Tensor parts = acc.reshaped({n, m});
        for (int q = 1; q < n; ++q) {
          Tensor mine = Tensor::host(posts[size_t(q)].out_dtype, {m});
          ops_.copy(parts.rows(q, q + 1), mine);  // rounded once, into that rank's output dtype
          ops_.synchronize();
          answer(q, mine);
        }
        ops_.copy(parts.rows(0, 1), out);
        break;
      }
      case Op::Broadcast: {
        const Tensor& src = inputs[size_t(p0.root)];
        for (int q = 1; q < n; ++q) {
          if (q == p0.root) {
            net::send_frame_header(l_->data[size_t(q)].get(), 'R', 0);
            continue;
          }
          answer(q, src);
        }
        if (p0.root != 0) std::memcpy(out.data(), src.data(), src.nbytes());
        break;
      }
    }
  }

  // Every rank's input, summed in f32 in rank order (the in-process group's sum_slices).
  Tensor sum(const std::vector<Tensor>& inputs) {
    const int64_t n = inputs[0].numel();
    Tensor acc = ops_.empty(DType::F32, {n});
    for (size_t r = 0; r < inputs.size(); ++r) {
      const Tensor part = inputs[r].reshaped({n, 1});
      if (r == 0) ops_.copy(part, acc);
      else ops_.add(acc, part);
    }
    ops_.synchronize();
    return acc;
  }

  // A connection failed: the other ranks learn why ('X', where they wait for an answer) and see their
  // connections close, so that none waits for ever; every later collective fails at once.
  void break_group(const std::string& why) {
    l_->broken = why;
    std::string frame(9, 'X');
    const uint64_t n = why.size();
    std::memcpy(frame.data() + 1, &n, 8);
    frame += why;
    for (int q = 1; q < l_->size; ++q) {
      const int fd = l_->data[size_t(q)].get();
      if (fd < 0) continue;
      [[maybe_unused]] ssize_t k = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(fd, SHUT_RDWR);
    }
  }

  std::shared_ptr<RankGroup::Links> l_;
  Ops& ops_;
};

}  // namespace

std::unique_ptr<Communicator> RankGroup::communicator(Ops& ops) {
  return std::make_unique<SocketCommunicator>(l_, ops);
}

}  // namespace mla
