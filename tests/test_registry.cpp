// The registry is the single source of truth for "supported?": every method a handler can return
// must resolve, on every platform this build has, to an implemented method; the rest is an error.
#include <gtest/gtest.h>

#include <set>

#include "mla/attention.h"
#include "mla/registry.h"

namespace mla {
namespace {

// Every (mode × prefix shape × settings) a handler distinguishes.
std::vector<std::pair<Batch, DispatchSettings>> handler_inputs() {
  std::vector<std::pair<Batch, DispatchSettings>> v;
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE, ForwardMode::TARGET_VERIFY,
                           ForwardMode::DRAFT_EXTEND, ForwardMode::IDLE})
    for (auto [prefix, seq] : {std::pair<int64_t, int64_t>{0, 10}, {5, 10}, {100, 200}, {150, 2000}})
      for (int flags = 0; flags < 16; ++flags) {
        Batch b = Batch::from_seq_lens(mode, {prefix}, {seq});
        if (mode == ForwardMode::IDLE) b = Batch{mode, {}};
        DispatchSettings s;
        s.chunked_prefix_threshold = 100, s.chunk_capacity = 1000;
        if (flags & 1) s.chunked_prefix_cache = false;
        s.deterministic = flags & 2;
        s.fused_decode_rope = flags & 4;
        if (flags & 8) s.chunk_capacity = 100;
        v.emplace_back(b, s);
      }
  return v;
}

TEST(Registry, EveryReachableMethodIsImplementedOnEveryBuiltPlatform) {
  int checked = 0;
  for (Platform p : all_platforms()) {
    if (!platform_built(p)) continue;
    std::set<ForwardMethod> reached;
    for (const std::string& backend : backend_names())
      for (auto [b, s] : handler_inputs()) {
        s.backend = backend;
        DispatchResult d = dispatch(b, s, p);
        reached.insert(d.resolved);
        EXPECT_TRUE(d.implemented) << backend << " on " << platform_name(p) << " reached " << method_name(d.resolved);
        ++checked;
      }
    EXPECT_TRUE(reached.count(ForwardMethod::MLA) || reached.count(ForwardMethod::MLA_ROCM));
  }
  EXPECT_GT(checked, 1000);
}

TEST(Registry, TheCpuRunsExactlyTheSharedMethods) {
  for (ForwardMethod m : all_methods())
    EXPECT_EQ(find_method_impl(m, Platform::CPU) != nullptr, is_generic(m)) << method_name(m);
}

TEST(Registry, UnbuiltPlatformsImplementNothing) {
  for (Platform p : all_platforms())
    if (!platform_built(p))
      for (ForwardMethod m : all_methods()) EXPECT_EQ(find_method_impl(m, p), nullptr);
}

TEST(Registry, OnlyMhaRefusesAPrefixAndOnlyTheFusedRopeDecodeRefusesAnExtend) {
  Batch with_prefix{ForwardMode::EXTEND, {{1, 0, 4}, {2, 7, 3}}};
  Batch fresh{ForwardMode::EXTEND, {{1, 0, 4}, {2, 0, 3}}};
  Batch decode{ForwardMode::DECODE, {{1, 5, 1}, {2, 0, 1}}};
  for (const MethodImpl* impl : method_impls()) {
    const bool fused = impl->method == ForwardMethod::MLA_FUSED_ROPE_ROCM;
    EXPECT_EQ(bool(impl->cannot_serve(fresh)), fused) << method_name(impl->method);
    EXPECT_EQ(bool(impl->cannot_serve(with_prefix)), impl->method == ForwardMethod::MHA || fused)
        << method_name(impl->method);
    EXPECT_EQ(bool(impl->cannot_serve(decode)), impl->method == ForwardMethod::MHA) << method_name(impl->method);
  }
}

// MHA_ROCM serves an extend with a prefix (aiter sends every extend to MHA), and ROCm's map is total.
TEST(Registry, TheRocmPlatformRunsExactlyItsTwins) {
  if (!platform_built(Platform::ROCM)) GTEST_SKIP() << "the ROCm platform is not built";
  for (ForwardMethod m : all_methods())
    EXPECT_EQ(find_method_impl(m, Platform::ROCM) != nullptr, !is_generic(m)) << method_name(m);
  DispatchSettings s;  // aiter, the ROCm default
  DispatchResult d = dispatch(Batch::from_seq_lens(ForwardMode::EXTEND, {4}, {9}), s, Platform::ROCM);
  EXPECT_EQ(d.method, ForwardMethod::MHA);
  EXPECT_EQ(d.resolved, ForwardMethod::MHA_ROCM);
  EXPECT_TRUE(d.implemented && d.serves) << d.reason;
  s.fused_decode_rope = true;
  d = dispatch(Batch::from_seq_lens(ForwardMode::DECODE, {4}, {5}), s, Platform::ROCM);
  EXPECT_EQ(d.resolved, ForwardMethod::MLA_FUSED_ROPE_ROCM);
  EXPECT_TRUE(d.implemented && d.serves) << d.reason;
}

TEST(Registry, DispatchExplainsWhatCannotRun) {
  // aiter rules send an extend with a prefix to MHA, which the CPU's MHA cannot serve.
  DispatchSettings s;
  s.backend = "aiter";
  DispatchResult d = dispatch(Batch::from_seq_lens(ForwardMode::EXTEND, {4}, {9}), s, Platform::CPU);
  EXPECT_EQ(d.method, ForwardMethod::MHA);
  EXPECT_TRUE(d.implemented);
  EXPECT_FALSE(d.serves);
  EXPECT_NE(d.reason.find("prefix of 4"), std::string::npos) << d.reason;
  // A platform that is not built: resolved, but not implemented, with a reason.
  if (!platform_built(Platform::ROCM)) {
    DispatchResult r = dispatch(Batch::from_seq_lens(ForwardMode::DECODE, {4}, {5}), {}, Platform::ROCM);
    EXPECT_EQ(r.resolved, ForwardMethod::MLA_ROCM);
    EXPECT_FALSE(r.implemented);
    EXPECT_NE(r.reason.find("rocm"), std::string::npos);
  }
}

}  // namespace
}  // namespace mla
