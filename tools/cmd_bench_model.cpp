// mla bench-model — the whole model's speed against its rooflines, measured in one run: decode
// steps at several batch sizes over a context, and prefills (one request or several), beside the platform's own
// copy bandwidth and GEMM throughput measured through the same Ops first. JSON on stdout. With
// --temperature, decode steps draw sampled tokens (on the platform, or on the host with
// --host-sampling), and Ops::sample_rows is timed alone against the logits download it replaces.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cxxabi.h>
#include <cstdio>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "cli_util.h"
#include "engine/sampler.h"
#include "run_opts.h"

namespace mla::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The platform's ceilings through its own Ops: a device-to-device copy (bytes read + written per
// second) and a square GEMM in the activation dtype (FLOP per second); best of `reps`.
struct Ceilings {
  double copy_bytes_s = 0, gemm_flop_s = 0;
};
Ceilings measure_ceilings(Ops& ops, bool small, int reps) {
  Ceilings c;
  const DType act = ops.act_dtype();
  const int64_t n = small ? (int64_t(1) << 24) : (int64_t(1) << 29);  // elements per copy
  Tensor a = ops.empty(act, {n}), b = ops.empty(act, {n});
  ops.fill_random(a, 1, 1.0);
  ops.copy(a, b);
  ops.synchronize();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    ops.copy(a, b);
    ops.synchronize();
    c.copy_bytes_s = std::max(c.copy_bytes_s, 2.0 * double(a.nbytes()) / seconds_since(t0));
  }
  const int64_t m = small ? 1024 : 8192;
  Tensor x = ops.empty(act, {m, m}), w = ops.empty(act, {m, m}), y = ops.empty(act, {m, m});
  ops.fill_random(x, 2, 1.0);
  ops.fill_random(w, 3, 1.0);
  ops.linear(x, w, y);
  ops.synchronize();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    ops.linear(x, w, y);
    ops.synchronize();
    c.gemm_flop_s = std::max(c.gemm_flop_s, 2.0 * double(m) * m * m / seconds_since(t0));
  }
  return c;
}

// What one token costs the model: its weights by part, the expert share, attention per key.
// The costs of one rank's step (with --tp N each rank holds 1/N of the heads, experts' widths and
// vocabulary, and the whole latent cache).
struct Costs {
  double weight_bytes = 0;      // every weight of this rank as stored
  double expert_bytes = 0;      // one routed expert of one layer (this rank's part)
  int64_t moe_layers = 0;
  double vocab_rows = 0;        // embedding rows this rank holds
  double embed_row_bytes = 0;   // one embedding row (a token reads one row of the table)
  double params_per_token = 0;  // weights a token multiplies (K routed experts of E; no embedding)
  double kv_row_bytes = 0;      // one cached token of every layer
  double attn_flops_per_key = 0;  // per query and key, all layers (absorbed MLA: QK over the row, PV over the latent)
};
Costs model_costs(const ModelConfig& c, const Model& m, DType act, DType kv) {
  Costs k;
  const double es = double(dtype_size(act)), H = double(c.hidden_size()), tp = double(m.tp_size());
  k.weight_bytes = double(m.parameters()) * es;
  const double expert = 3.0 * double(c.moe_intermediate_size) / tp * H;
  k.expert_bytes = expert * es;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) k.moe_layers += c.is_moe_layer(i);
  k.vocab_rows = std::ceil(double(c.vocab_size) / tp);
  k.embed_row_bytes = H * es;
  k.params_per_token = double(m.parameters()) - k.vocab_rows * H -
                       double(k.moe_layers) * double(c.n_routed_experts - c.num_experts_per_tok) * expert;
  k.kv_row_bytes = double(c.num_hidden_layers) * double(c.attn.kv_row_dim()) * double(dtype_size(kv));
  k.attn_flops_per_key = double(c.num_hidden_layers) * double(c.attn.num_attention_heads) / tp * 2.0 *
                         double(c.attn.kv_row_dim() + c.attn.kv_lora_rank);
  return k;
}

// Ops::sample_rows on random logits [R, V] (temperature `t`, no cuts) against what the host path
// does with the same rows: download them, then sample each on the host. Medians of `reps`, µs.
nlohmann::json time_sample_rows(Ops& ops, int64_t R, int64_t V, double t, int reps) {
  Tensor x = ops.empty(DType::F32, {R, V}), ids = ops.empty(DType::I32, {R});
  ops.fill_random(x, 7, 2.0);
  std::vector<SampleRow> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) rows[size_t(r)] = SampleRow{t, 1.0, 0.0, engine::stream_uniform(1, uint64_t(r), 0), 0};
  std::vector<double> op, down;
  Tensor h;
  ops.synchronize();
  for (int i = 0; i < reps + 1; ++i) {  // the first is a warm-up
    auto t0 = Clock::now();
    ops.sample_rows(x, rows, ids);
    ops.synchronize();
    const double a = seconds_since(t0);
    t0 = Clock::now();
    h = ops.download(x);
    const double b = seconds_since(t0);
    if (i > 0) op.push_back(a), down.push_back(b);
  }
  // The host sampler once (a row of a large vocabulary takes milliseconds: its sort).
  const auto t0 = Clock::now();
  int64_t sink = 0;
  for (int64_t r = 0; r < R; ++r) sink += sample_index(h.ptr<float>() + r * V, V, rows[size_t(r)]);
  const double host_s = seconds_since(t0);
  if (sink < 0) std::fprintf(stderr, "?");  // keeps the draws
  const double o = median(op) * 1e6, d = median(down) * 1e6, hs = host_s * 1e6;
  std::fprintf(stderr, "  sample_rows R %-4ld V %-7ld: %9.1f us on the platform; download %9.1f us (%.1f GB/s) + host sampler %10.1f us\n",
               long(R), long(V), o, d, double(R * V * 4) / d / 1e3, hs);
  return {{"kind", "sample_rows"}, {"rows", R}, {"vocab", V}, {"temperature", t}, {"op_us", o},
          {"download_us", d}, {"host_sample_us", hs}};
}

}  // namespace

namespace {

// One step's device activity: the kernels' span (first kernel's start to the last kernel's end),
// the time inside it when no kernel runs (the union of the kernels' intervals, so side-lane
// overlap counts once), the gaps between busy stretches, the copies around the kernels, and every
// kernel's place on the timeline (which lane waited for which).
nlohmann::json activity_summary(const std::vector<DeviceSpan>& spans) {
  std::vector<std::pair<uint64_t, uint64_t>> k;  // kernels' [start, end), in start order
  int64_t copies = 0;
  std::map<std::string, std::pair<int64_t, double>> by_name;  // calls, µs
  nlohmann::json timeline = nlohmann::json::array();
  for (const DeviceSpan& d : spans) {
    if (d.name == "memcpy" || d.name == "memset") {
      ++copies;
      continue;
    }
    k.emplace_back(d.start_ns, d.end_ns);
    int status = 0;
    char* dm = abi::__cxa_demangle(d.name.c_str(), nullptr, nullptr, &status);
    std::string name = status == 0 && dm ? dm : d.name;
    std::free(dm);
    for (size_t at; (at = name.find("(anonymous namespace)::")) != std::string::npos;) name.erase(at, 23);
    name = name.substr(0, name.find('('));
    if (name.rfind("void ", 0) == 0) name = name.substr(5);
    auto& n = by_name[name];
    n.first += 1, n.second += double(d.end_ns - d.start_ns) / 1e3;
    // [start µs from the step's first record, µs, stream, kernel]: the order and overlap of the lanes
    timeline.push_back({double(d.start_ns - spans.front().start_ns) / 1e3, double(d.end_ns - d.start_ns) / 1e3,
                        d.stream, name.substr(0, name.find('<'))});
  }
  nlohmann::json j{{"kernels", k.size()}, {"copies", copies}};
  if (k.empty()) return j;
  uint64_t busy = 0, end = k[0].first;
  std::vector<double> gaps;  // µs
  for (const auto& [a, b] : k) {
    if (a > end) gaps.push_back(double(a - end) / 1e3);
    busy += b > std::max(a, end) ? b - std::max(a, end) : 0;
    end = std::max(end, b);
  }
  const uint64_t span = end - k[0].first;
  std::sort(gaps.begin(), gaps.end());
  double gap_sum = 0;
  for (double g : gaps) gap_sum += g;
  std::vector<std::pair<double, std::string>> top;
  for (const auto& [name, n] : by_name) top.emplace_back(n.second, fmt::format("{} ×{}", name, n.first));
  std::sort(top.rbegin(), top.rend());
  nlohmann::json heavy = nlohmann::json::array();  // every kernel, the heaviest first (print_activity: 8)
  for (const auto& [us, kernel] : top) heavy.push_back({{"kernel", kernel}, {"us", us}});
  j["kernel_span_ms"] = double(span) / 1e6;
  j["busy_ms"] = double(busy) / 1e6;
  j["idle_fraction"] = 1.0 - double(busy) / double(span);
  j["gaps"] = gaps.size();
  j["gap_median_us"] = gaps.empty() ? 0.0 : gaps[gaps.size() / 2];
  j["gap_max_us"] = gaps.empty() ? 0.0 : gaps.back();
  j["gap_sum_ms"] = gap_sum / 1e3;
  j["heaviest"] = heavy;
  j["timeline"] = timeline;
  return j;
}

void print_activity(const nlohmann::json& a) {
  if (!a.contains("busy_ms")) return;
  std::fprintf(stderr,
               "    activity: %ld kernels, %ld copies; kernels busy %.3f of their %.3f ms (idle %.1f %%: %ld gaps, "
               "median %.2f us, largest %.1f us)\n",
               long(a["kernels"]), long(a["copies"]), double(a["busy_ms"]), double(a["kernel_span_ms"]),
               100 * double(a["idle_fraction"]), long(a["gaps"]), double(a["gap_median_us"]),
               double(a["gap_max_us"]));
  std::string h;
  for (size_t i = 0; i < a["heaviest"].size() && i < 8; ++i)
    h += fmt::format("  {} {:.0f} us;", std::string(a["heaviest"][i]["kernel"]), double(a["heaviest"][i]["us"]));
  std::fprintf(stderr, "    heaviest:%s\n", h.c_str());
}

}  // namespace

void add_bench_model_command(CLI::App& app, int& rc) {
  struct Opts : RunOpts {
    std::string batches = "1,16,64,128";
    int64_t context = 1024, steps = 16;
    double context_spread = 0;
    std::string prefill = "4096";
    int reps = 5;
    double temperature = 0;
    bool host_sampling = false;
    std::string sample_vocab;
    bool activity = false;
    bool overlap = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("bench-model", "Whole-model decode and prefill speed against the in-run rooflines (JSON)");
  o->add(sub);
  sub->add_option("--batch", o->batches, "decode batch sizes, comma-separated")->capture_default_str();
  sub->add_option("--context", o->context, "tokens in each request's cache before decoding")->capture_default_str();
  sub->add_option("--context-spread", o->context_spread,
                  "S in [0, 1]: each request's context drawn evenly from context·(1 ± S) (mean context; the same "
                  "draw every run), as a serving batch's lengths differ")->capture_default_str();
  sub->add_option("--steps", o->steps, "timed decode steps per batch size")->capture_default_str();
  sub->add_option("--prefill", o->prefill,
                  "timed prefills, comma-separated: N (one request of N tokens) or RxN (R requests of N "
                  "tokens in one batch); 0: none")->capture_default_str();
  sub->add_option("--reps", o->reps, "repetitions of each ceiling measurement")->capture_default_str();
  sub->add_option("--temperature", o->temperature,
                  "decode steps draw sampled tokens at this temperature (0: greedy ids on the platform); "
                  "Ops::sample_rows is timed alone too")->capture_default_str();
  sub->add_flag("--host-sampling", o->host_sampling,
                "with --temperature: download the logits and sample on the host (the path for penalties and logprobs)");
  sub->add_option("--sample-vocab", o->sample_vocab,
                  "with --temperature: vocabulary sizes of the sample_rows timing, comma-separated (default: the model's)");
  sub->add_flag("--activity", o->activity,
                "record one more step of each decode batch and prefill with the device's own activity record (CUPTI on "
                "CUDA): kernels, their busy time and the idle gaps between them");
  sub->add_flag("--overlap", o->overlap,
                "decode a step ahead (Engine::decode_launch): step N + 1 is planned and issued before step N's "
                "tokens reach the host, which read it from the device; the step time is then the time between "
                "two steps' tokens (tp 1; greedy or platform sampling)");
  sub->callback([o, &rc] {
    o->parse();
    if (o->overlap && o->host_sampling) throw UsageError("--overlap keeps the tokens on the device: no --host-sampling");
    std::vector<int64_t> batches;
    for (int64_t b : parse_int_list(o->batches, "--batch")) {
      if (b <= 0) throw UsageError("--batch sizes must be positive");
      batches.push_back(b);
    }
    if (o->context <= 0 || o->steps <= 0 || o->reps <= 0)
      throw UsageError("--context, --steps and --reps must be positive");
    if (!(o->context_spread >= 0 && o->context_spread <= 1)) throw UsageError("--context-spread must be in [0, 1]");
    // Request r's context (r < B): context + round(S · context · (2u − 1)), u uniform in [0, 1) from a
    // fixed generator, at least 1 token.
    auto contexts = [&o](int64_t B) {
      std::mt19937_64 g(77);
      std::vector<int64_t> v(static_cast<size_t>(B), o->context);
      if (o->context_spread > 0)
        for (int64_t& x : v) {
          const double u = double(g() >> 11) * 0x1.0p-53;
          x = std::max<int64_t>(1, o->context + std::llround(o->context_spread * double(o->context) * (2 * u - 1)));
        }
      return v;
    };
    std::vector<std::pair<int64_t, int64_t>> prefills;  // (requests, tokens each)
    if (o->prefill != "0")
      for (size_t b = 0; b <= o->prefill.size();) {
        size_t end = o->prefill.find(',', b);
        if (end == std::string::npos) end = o->prefill.size();
        const std::string item = o->prefill.substr(b, end - b);
        b = end + 1;
        const size_t x = item.find('x');
        const std::vector<int64_t> v = parse_int_list(x == std::string::npos ? item : item.substr(0, x) + "," + item.substr(x + 1), "--prefill");
        const int64_t r = v.size() == 2 ? v[0] : 1, n = v.back();
        if (v.size() > 2 || r <= 0 || n <= 0) throw UsageError("--prefill items are N or RxN with R, N > 0, got '" + item + "'");
        prefills.emplace_back(r, n);
      }
    if (!(o->temperature >= 0 && o->temperature <= 100)) throw UsageError("--temperature must be in [0, 100]");
    if (o->temperature == 0 && (o->host_sampling || !o->sample_vocab.empty()))
      throw UsageError("--host-sampling and --sample-vocab need --temperature");
    std::vector<int64_t> sample_vocab;
    if (!o->sample_vocab.empty())
      for (int64_t v : parse_int_list(o->sample_vocab, "--sample-vocab")) {
        if (v <= 0) throw UsageError("--sample-vocab sizes must be positive");
        sample_vocab.push_back(v);
      }
    int64_t pool = 64;
    for (const auto& [r, n] : prefills) pool = std::max(pool, r * (n + o->page_size) + 64);
    for (int64_t b : batches) {
      int64_t need = 0;
      for (int64_t x : contexts(b)) need += x + o->steps + 6 + o->page_size;
      pool = std::max(pool, need);
    }
    Session s = open_session(*o, pool);
    Ops& ops = *s.ops;
    if (o->activity && !ops.can_record_activity())
      fail("--activity: {} keeps no record of device activity", ops.name());
    const ModelConfig& c = s.lm.config;
    const bool small = ops.platform() == Platform::CPU;
    const Ceilings ceil = measure_ceilings(ops, small, o->reps);
    const Costs k = model_costs(c, *s.lm.model, o->act, o->kv);
    nlohmann::json out;
    out["model"] = o->model_name();
    out["tp"] = s.lm.model->tp_size();
    out["platform"] = ops.name();
    out["kv_dtype"] = dtype_name(o->kv);
    out["graphs"] = o->fwd.graphs && ops.can_capture();
    out["copy_GB_s"] = ceil.copy_bytes_s / 1e9;
    out["gemm_TFLOP_s"] = ceil.gemm_flop_s / 1e12;
    out["weights_GB"] = k.weight_bytes / 1e9;
    std::fprintf(stderr, "mla bench-model: %s on %s; ceilings: copy %.0f GB/s, GEMM %.1f TFLOP/s\n",
                 o->model_name().c_str(), ops.name().c_str(), ceil.copy_bytes_s / 1e9, ceil.gemm_flop_s / 1e12);
    out["temperature"] = o->temperature;
    out["sampling"] = o->temperature == 0 ? "greedy" : o->host_sampling ? "host" : "platform";
    out["overlap"] = o->overlap;
    if (o->temperature > 0) {
      if (sample_vocab.empty()) sample_vocab.push_back(c.vocab_size);
      for (int64_t V : sample_vocab)
        for (int64_t B : batches) out["rows"].push_back(time_sample_rows(ops, B, V, o->temperature, 20));
    }
    std::mt19937_64 rng(1);
    auto random_ids = [&](int64_t n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int32_t& t : v) t = int32_t(rng() % uint64_t(c.vocab_size));
      return v;
    };
    Engine& e = *s.engine;
    // The model's timeline sections (Ops::mark) of the last run with the timeline on, summed over
    // the layers; the timeline goes off again.
    auto read_sections = [&ops] {
      std::map<std::string, double> sections;
      double device_ms = 0;
      for (const auto& [label, ms] : ops.timeline()) sections[label] += ms, device_ms += ms;
      ops.set_timeline(false);
      return std::pair{device_ms, sections};
    };
    auto print_sections = [](double device_ms, const std::map<std::string, double>& sections, double wall_s) {
      std::string sec;
      for (const auto& [label, ms] : sections) sec += fmt::format(" {} {:.3f}", label, ms);
      std::fprintf(stderr, "    device %.3f ms of the step's %.3f:%s\n", device_ms, wall_s * 1e3, sec.c_str());
    };
    for (int64_t B : batches) {
      // Fill every request's cache with its context (untimed), in steps of up to 8192 tokens.
      const std::vector<int64_t> ctx_of = contexts(B);
      std::vector<StepRequest> fill;
      std::vector<int32_t> last(static_cast<size_t>(B));
      int64_t tokens = 0;
      auto flush = [&] {
        if (fill.empty()) return;
        StepResult r = e.step(ForwardMode::EXTEND, fill, /*last_only=*/true, /*greedy=*/true);
        for (size_t i = 0; i < fill.size(); ++i) last[size_t(fill[i].id - 1)] = r.greedy[i];
        fill.clear(), tokens = 0;
      };
      for (int64_t r = 0; r < B; ++r) {
        const int64_t n = ctx_of[size_t(r)];
        if (tokens + n > 8192) flush();
        fill.push_back({RequestId(r + 1), random_ids(n)});
        tokens += n;
      }
      flush();
      std::vector<double> times;
      // The two untimed steps, so a row says what recording a step graph costs beside a replay:
      // without --overlap the shape's first step (op by op) and second (where a platform records its
      // graph); with it the step that records and the first replay (its first launch is not timed).
      std::vector<double> warmup;
      StepCounters counted;  // over the timed steps
      auto sample_rows_of = [&](int64_t step) {
        std::vector<SampleRow> rows;
        for (int64_t r = 0; r < B; ++r)
          rows.push_back(SampleRow{o->temperature, 1.0, 0.0, engine::stream_uniform(1, uint64_t(r), uint64_t(step)), 0});
        return rows;
      };
      auto decode_step = [&](int64_t step) {
        std::vector<StepRequest> d;
        for (int64_t r = 0; r < B; ++r) d.push_back({RequestId(r + 1), {last[size_t(r)]}});
        const std::vector<SampleRow> rows = sample_rows_of(step);
        StepResult res;  // the ids (or logits) come back: the step is done
        if (o->temperature == 0) {
          res = e.step(ForwardMode::DECODE, d, true, true);
        } else if (!o->host_sampling) {
          res = e.step(ForwardMode::DECODE, d, true, false, &rows);
          res.greedy = res.sampled;
        } else {
          res = e.step(ForwardMode::DECODE, d, true, false);
          for (int64_t r = 0; r < B; ++r)
            res.greedy.push_back(sample_index(res.logits.data() + r * c.vocab_size, c.vocab_size, rows[size_t(r)]));
        }
        for (int64_t r = 0; r < B; ++r) last[size_t(r)] = res.greedy[size_t(r)];
      };
      auto count = [&](const StepCounters& c0) {
        const StepCounters dc = ops.counters() - c0;
        counted.h2d_copies += dc.h2d_copies, counted.d2h_copies += dc.d2h_copies;
        counted.host_syncs += dc.host_syncs;
        counted.graph_replays += dc.graph_replays, counted.graph_captures += dc.graph_captures;
      };
      if (!o->overlap) {
        for (int64_t step = 0; step < o->steps + 2; ++step) {  // two untimed warm-up steps
          const StepCounters c0 = ops.counters();
          const auto t0 = Clock::now();
          decode_step(step);
          const double t = seconds_since(t0);
          if (step >= 2) times.push_back(t), count(c0);
          else warmup.push_back(t);
        }
      } else {  // a step ahead: a step's time runs from one step's tokens on the host to the next's
        const bool sampled = o->temperature > 0;
        std::vector<StepRequest> first, after;
        for (int64_t r = 0; r < B; ++r)
          first.push_back({RequestId(r + 1), {last[size_t(r)]}}), after.push_back({RequestId(r + 1), {}});
        std::vector<SampleRow> rows = sample_rows_of(0);
        Engine::InFlight cur = e.decode_launch(first, nullptr, sampled ? &rows : nullptr);
        auto t0 = Clock::now();
        for (int64_t step = 1; step <= o->steps + 2; ++step) {  // two untimed warm-up steps
          const StepCounters c0 = ops.counters();
          rows = sample_rows_of(step);
          Engine::InFlight next = e.decode_launch(after, &cur, sampled ? &rows : nullptr);
          e.finish(cur);
          const double t = seconds_since(t0);
          t0 = Clock::now();
          if (step > 2) times.push_back(t), count(c0);
          else warmup.push_back(t);
          cur = std::move(next);
        }
        const std::vector<int32_t> ids = e.finish(cur);
        last.assign(ids.begin(), ids.end());
      }
      // Where the step's device time goes: the model's timeline sections (Ops::mark) of one more
      // step (after one that records its graph with the marks), summed over the layers.
      ops.set_timeline(true);
      for (int64_t k = 0; k < 2; ++k) {
        decode_step(o->steps + 2 + k);
        if (k == 0) ops.timeline();
      }
      const auto [device_ms, sections] = read_sections();
      nlohmann::json activity;
      if (o->activity) {  // the production graph (no marks), warm, then one step recorded
        decode_step(o->steps + 4);
        ops.activity_begin();
        decode_step(o->steps + 5);
        activity = activity_summary(ops.activity_end());
      }
      for (int64_t r = 0; r < B; ++r) e.release(RequestId(r + 1));
      // Keys the timed steps read, per step: every request's context plus half the steps.
      double keys = 0;
      for (int64_t x : ctx_of) keys += double(x + o->steps / 2);
      const double E = double(c.n_routed_experts), K = double(c.num_experts_per_tok);
      const double touched = E > 0 ? E * (1.0 - std::pow(1.0 - K / E, double(B))) : 0;  // distinct experts per layer
      const double bytes = k.weight_bytes - double(k.moe_layers) * (E - touched) * k.expert_bytes -
                           std::max(0.0, k.vocab_rows - double(B)) * k.embed_row_bytes + keys * k.kv_row_bytes;
      const double flops = 2.0 * k.params_per_token * double(B) + keys * k.attn_flops_per_key;
      const double roof = std::max(bytes / ceil.copy_bytes_s, flops / ceil.gemm_flop_s);
      const double step_s = median(times);
      nlohmann::json row{{"kind", "decode"}, {"batch", B}, {"context", o->context},
                         {"context_spread", o->context_spread},
                         {"context_max", *std::max_element(ctx_of.begin(), ctx_of.end())}, {"step_ms", step_s * 1e3},
                         {"sampling", out["sampling"]},
                         {"tokens_per_s", double(B) / step_s}, {"bytes_GB", bytes / 1e9}, {"GFLOP", flops / 1e9},
                         {"roofline_ms", roof * 1e3}, {"x_roofline", step_s / roof},
                         // per step, the whole engine step (the final id download included)
                         {"h2d_copies", double(counted.h2d_copies) / double(o->steps)},
                         {"d2h_copies", double(counted.d2h_copies) / double(o->steps)},
                         {"host_syncs", double(counted.host_syncs) / double(o->steps)},
                         {"graph_replays", double(counted.graph_replays) / double(o->steps)},
                         {"graph_captures", counted.graph_captures},
                         {"warmup_ms", {warmup[0] * 1e3, warmup[1] * 1e3}},
                         // the device's time in the model's sections (one step, timeline events)
                         {"device_ms", device_ms}, {"sections_ms", sections}};
      if (o->activity) row["activity"] = activity;
      out["rows"].push_back(row);
      std::fprintf(stderr,
                   "  decode b%-4ld ctx %ld%s: %8.3f ms/step %9.1f tok/s   roofline %7.3f ms (%.2f GB, %.1f GFLOP)  %.2fx"
                   "   per step: %.1f H2D, %.1f D2H, %.1f host syncs, %.2f graph replays\n",
                   long(B), long(o->context),
                   o->context_spread > 0 ? fmt::format(" ± {:.0f} %", 100 * o->context_spread).c_str() : "", step_s * 1e3, double(B) / step_s, roof * 1e3, bytes / 1e9, flops / 1e9,
                   step_s / roof, double(counted.h2d_copies) / double(o->steps),
                   double(counted.d2h_copies) / double(o->steps), double(counted.host_syncs) / double(o->steps),
                   double(counted.graph_replays) / double(o->steps));
      print_sections(device_ms, sections, step_s);
      if (o->activity) print_activity(activity);
    }
    for (const auto& [R, N] : prefills) {
      std::vector<double> times;
      nlohmann::json activity;
      double device_ms = 0;
      std::map<std::string, double> sections;
      // The first is a warm-up; rep 3, untimed, reads the timeline; rep 4 (--activity) is recorded.
      for (int rep = 0; rep < (o->activity ? 5 : 4); ++rep) {
        ops.set_timeline(rep == 3);
        std::vector<StepRequest> reqs;
        for (int64_t r = 0; r < R; ++r) reqs.push_back({RequestId(r + 1), random_ids(N)});
        if (rep == 4) ops.activity_begin();
        const auto t0 = Clock::now();
        e.step(ForwardMode::EXTEND, reqs, true, true);
        const double t = seconds_since(t0);
        if (rep == 4) activity = activity_summary(ops.activity_end());
        if (rep == 3) std::tie(device_ms, sections) = read_sections();
        if (rep > 0 && rep < 3) times.push_back(t);
        for (int64_t r = 0; r < R; ++r) e.release(RequestId(r + 1));
      }
      const double t = median(times), n = double(N), tokens = double(R * N);
      // Every token through every layer; the LM head for the last token of each request only (the
      // step's logits are those rows).
      const double lm_head = k.vocab_rows * double(c.hidden_size());
      const double flops = double(R) * (2.0 * (k.params_per_token - lm_head) * n + 2.0 * lm_head +
                                        n * n / 2 * double(c.num_hidden_layers) *
                                            double(c.attn.num_attention_heads / s.lm.model->tp_size()) * 2.0 *
                                            double(c.attn.qk_head_dim() + c.attn.v_head_dim));
      const double roof = std::max(flops / ceil.gemm_flop_s, k.weight_bytes / ceil.copy_bytes_s);
      out["rows"].push_back({{"kind", "prefill"}, {"requests", R}, {"tokens", N}, {"ms", t * 1e3},
                             {"tokens_per_s", tokens / t}, {"GFLOP", flops / 1e9}, {"roofline_ms", roof * 1e3},
                             {"x_roofline", t / roof}, {"device_ms", device_ms}, {"sections_ms", sections}});
      if (o->activity) out["rows"].back()["activity"] = activity;
      std::fprintf(stderr, "  prefill %ld x %ld tokens: %8.2f ms (%.0f tok/s)   roofline %.2f ms (%.0f GFLOP)  %.2fx\n",
                   long(R), long(N), t * 1e3, tokens / t, roof * 1e3, flops / 1e9, t / roof);
      print_sections(device_ms, sections, t);
      if (o->activity) print_activity(activity);
    }
    std::printf("%s\n", out.dump(2).c_str());
    rc = 0;
  });
}

}  // namespace mla::cli
