// CPU timings of each forward method on a DeepSeek-V2-Lite attention layer (f32 activations,
// bf16 latent KV pool): prefill with a long prefix, and batched decode. Times the forward call
// alone (projections + cache write + attention + o_proj), not the setup.
#include <benchmark/benchmark.h>

#include <limits>
#include <map>
#include <memory>

#include "mla/config.h"
#include "mla/reference_harness.h"

namespace {

using namespace mla;

LayerFixture& fixture(const std::string& name, ForwardMode mode, std::vector<std::pair<int64_t, int64_t>> reqs) {
  static std::map<std::string, std::unique_ptr<LayerFixture>> cache;
  auto& f = cache[name];
  if (!f) {
    LayerCase c;
    c.name = name, c.cfg = preset_config("deepseek-v2-lite"), c.act = DType::F32, c.kv = DType::BF16;
    c.mode = mode, c.requests = std::move(reqs), c.page_size = 64;
    f = std::make_unique<LayerFixture>(c);
  }
  return *f;
}

void run(benchmark::State& state, LayerFixture& fx, ForwardMethod m) {
  for (auto _ : state) {
    LayerRun r = fx.run(m, std::numeric_limits<double>::quiet_NaN());
    state.SetIterationTime(r.seconds);
  }
}

void BM_Prefill4096Plus512(benchmark::State& state, ForwardMethod m) {
  run(state, fixture("prefill", ForwardMode::EXTEND, {{4096, 512}}), m);
}
void BM_Decode16x4096(benchmark::State& state, ForwardMethod m) {
  run(state, fixture("decode", ForwardMode::DECODE, std::vector<std::pair<int64_t, int64_t>>(16, {4096, 1})), m);
}

#define MLA_BENCH_METHOD(fn, m) \
  BENCHMARK_CAPTURE(fn, m, ForwardMethod::m)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
MLA_BENCH_METHOD(BM_Prefill4096Plus512, MHA_ONE_SHOT)
MLA_BENCH_METHOD(BM_Prefill4096Plus512, MHA_CHUNKED_KV)
MLA_BENCH_METHOD(BM_Prefill4096Plus512, MLA)
MLA_BENCH_METHOD(BM_Decode16x4096, MHA_ONE_SHOT)
MLA_BENCH_METHOD(BM_Decode16x4096, MHA_CHUNKED_KV)
MLA_BENCH_METHOD(BM_Decode16x4096, MLA)

}  // namespace

BENCHMARK_MAIN();
