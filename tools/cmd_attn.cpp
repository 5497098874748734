// mla attn — one attention layer with random weights on a described batch, by a chosen or
// dispatched method: its error against the float64 reference and its time.
// mla demo — the method each batch kind gets, and every method's agreement with the reference.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "mla/config.h"
#include "mla/error.h"
#include "mla/reference_harness.h"
#include "mla/registry.h"

namespace mla::cli {
namespace {

std::string fmt_err(double e) { return std::isfinite(e) ? fmt::format("{:.2e}", e) : "inf"; }

}  // namespace

void add_attn_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string preset = "deepseek-v2-lite", config, requests = "0:16", mode = "extend", method = "auto";
    int64_t page_size = 16, repeat = 1;
    uint64_t seed = 1;
    bool no_check = false, json = false, verbose = false;
    PlatformFlags platform;
    DtypeFlags dtypes{"f32", "bf16"};
    DispatchFlags dispatch;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("attn", "Run one attention layer (random weights) and check it");
  o->platform.add(sub);
  o->dtypes.add(sub);
  o->dispatch.add(sub);
  sub->add_option("--preset", o->preset, "deepseek-v3 | deepseek-v2-lite")->capture_default_str();
  sub->add_option("--config", o->config, "an HF config.json instead of a preset");
  sub->add_option("--requests", o->requests, "PREFIX:NEW per request, e.g. 4096:512,0:17")->capture_default_str();
  sub->add_option("--mode", o->mode, "extend|decode|target_verify|draft_extend|idle")->capture_default_str();
  sub->add_option("--method", o->method, "auto (dispatch) or MHA|MHA_ONE_SHOT|MHA_CHUNKED_KV|MLA|...")->capture_default_str();
  sub->add_option("--page-size", o->page_size, "KV pool page size")->capture_default_str();
  sub->add_option("--repeat", o->repeat, "runs to time (the best is reported)")->capture_default_str();
  sub->add_option("--seed", o->seed, "random seed")->capture_default_str();
  sub->add_flag("--no-check", o->no_check, "skip the float64 reference (for timing large batches)");
  sub->add_flag("--json", o->json, "one JSON object on stdout");
  sub->add_flag("-v,--verbose", o->verbose, "progress on stderr");
  sub->callback([o, &rc] {
    LayerCase c;
    std::optional<ForwardMethod> method;
    try {
      c.cfg = o->config.empty() ? preset_config(o->preset) : load_attention_config(o->config);
      c.platform = o->platform.parse();
      c.act = o->dtypes.act();
      c.kv = o->dtypes.kv();
      c.mode = parse_mode(o->mode);
      c.requests = parse_requests(o->requests);
      if (o->method != "auto") method = parse_method(o->method);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    if (o->page_size <= 0 || o->repeat <= 0) throw UsageError("--page-size and --repeat must be positive");
    c.page_size = o->page_size, c.seed = o->seed;
    c.options = o->platform.options();
    c.settings = o->dispatch.parse();
    // Check the batch and the method before the (slow) weights and reference are built.
    Batch batch = Batch::from_lengths(c.mode, c.requests);
    try {
      validate_batch(batch);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    // As the engine: no position past the config's context (this also bounds the inputs built).
    for (size_t i = 0; i < c.requests.size(); ++i)
      if (c.requests[i].first + c.requests[i].second > c.cfg.max_position_embeddings)
        throw UsageError(fmt::format("--requests: request {} reaches {} tokens, past "
                                     "max_position_embeddings {}", i,
                                     c.requests[i].first + c.requests[i].second,
                                     c.cfg.max_position_embeddings));
    if (method) require_method_impl(*method, c.platform, batch);
    if (o->verbose) std::fprintf(stderr, "mla attn: building weights, inputs and prefix rows...\n");
    LayerFixture fx(c);
    LayerRun best;
    for (int64_t i = 0; i < o->repeat; ++i) {
      LayerRun r = fx.run(method, std::numeric_limits<double>::quiet_NaN());
      if (i == 0 || r.seconds < best.seconds) best = std::move(r);
    }
    nlohmann::json j = {{"method", method_name(best.method)}, {"platform", o->platform.platform},
                        {"dtype", o->dtypes.dtype}, {"kv_dtype", o->dtypes.kv_dtype}, {"tokens", best.lse.size() / size_t(c.cfg.num_attention_heads)},
                        {"seconds", best.seconds}};
    bool ok = true;
    if (!o->no_check) {
      if (o->verbose) std::fprintf(stderr, "mla attn: float64 reference...\n");
      LayerErrors e = fx.errors(best);
      const Tolerance tol = tolerance(c, best.method);
      ok = within(e, tol);
      j["error"] = {{"out", e.out}, {"lse", e.lse}, {"rows", e.rows},
                    {"tolerance", {{"out", tol.out}, {"lse", tol.lse}, {"rows", tol.rows}}}, {"pass", ok}};
    }
    if (o->json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("method %s on %s (%s, kv %s): %.3f ms\n", std::string(method_name(best.method)).c_str(),
                  o->platform.platform.c_str(), o->dtypes.dtype.c_str(), o->dtypes.kv_dtype.c_str(), best.seconds * 1e3);
      if (!o->no_check)
        std::printf("relative L2 vs f64 reference: out %s  lse %s  rows %s  (tolerance %.0e %.0e %.0e) %s\n",
                    fmt_err(j["error"]["out"]).c_str(), fmt_err(j["error"]["lse"]).c_str(),
                    fmt_err(j["error"]["rows"]).c_str(), double(j["error"]["tolerance"]["out"]),
                    double(j["error"]["tolerance"]["lse"]), double(j["error"]["tolerance"]["rows"]), ok ? "PASS" : "FAIL");
    }
    rc = ok ? 0 : kExitFailure;
  });
}

void add_attn_demo_command(CLI::App& app, int& rc) {
  CLI::App* sub = app.add_subcommand("demo-attn", "One attention layer: dispatch per batch kind, every method vs the f64 reference");
  sub->callback([&rc] {
    struct Kind { const char* name; ForwardMode mode; std::vector<std::pair<int64_t, int64_t>> reqs; };
    const std::vector<Kind> kinds = {
        {"prefill, no prefix", ForwardMode::EXTEND, {{0, 37}, {0, 11}}},
        {"extend, short prefix", ForwardMode::EXTEND, {{53, 7}, {0, 5}}},
        {"extend, prefix >= threshold", ForwardMode::EXTEND, {{96, 8}, {40, 3}}},
        {"decode", ForwardMode::DECODE, {{61, 1}, {7, 1}, {30, 1}}},
        {"target verify (3 drafts)", ForwardMode::TARGET_VERIFY, {{41, 3}, {12, 3}}},
        {"draft extend", ForwardMode::DRAFT_EXTEND, {{29, 2}, {5, 2}}},
    };
    AttentionConfig cfg = preset_config("deepseek-v2-lite");
    std::printf("mla demo-attn: one DeepSeek-V2-Lite attention layer (hidden %ld, %ld heads, kv_lora_rank %ld),\n"
                "random weights, f32 activations, bf16 latent KV pool (page 16), NaN in unused rows.\n"
                "The chunked-prefix threshold is lowered to 64 and the chunk capacity to 64 tokens so\n"
                "small batches show every rule.\n\n",
                long(cfg.hidden_size), long(cfg.num_attention_heads), long(cfg.kv_lora_rank));
    bool ok = true;
    for (const Kind& k : kinds) {
      LayerCase c;
      c.cfg = cfg, c.act = DType::F32, c.kv = DType::BF16, c.mode = k.mode, c.requests = k.reqs;
      c.settings.chunked_prefix_threshold = 64, c.settings.chunk_capacity = 64;
      const Batch b = Batch::from_lengths(k.mode, k.reqs);
      std::string desc;
      for (auto [p, n] : k.reqs) desc += fmt::format("{}{}+{}", desc.empty() ? "" : ", ", p, n);
      std::printf("%-28s requests (prefix+new): %s\n", k.name, desc.c_str());
      for (auto [backend, plat] : {std::pair{"fa3", Platform::CPU}, std::pair{"triton", Platform::CPU},
                                   std::pair{"aiter", Platform::ROCM}}) {
        DispatchSettings ds = c.settings;
        ds.backend = backend;
        DispatchResult d = dispatch(b, ds, plat);
        std::printf("  %-6s on %-4s -> %-15s resolved %-19s %s\n", backend, std::string(platform_name(plat)).c_str(),
                    std::string(method_name(d.method)).c_str(), std::string(method_name(d.resolved)).c_str(),
                    d.implemented && d.serves ? "runs here" : ("not here: " + d.reason).c_str());
      }
      LayerFixture fx(c);
      std::printf("  vs f64 reference (relative L2 of the layer output; tolerances per method and output):\n   ");
      for (ForwardMethod m : generic_methods()) {
        try {
          LayerRun r = fx.run(m, std::numeric_limits<double>::quiet_NaN());
          LayerErrors e = fx.errors(r);
          const bool pass = within(e, tolerance(c, m));
          ok &= pass;
          std::printf(" %s %s%s", std::string(method_name(m)).c_str(), fmt_err(e.out).c_str(), pass ? "" : " FAIL");
        } catch (const Error& e) {
          const bool expected = m == ForwardMethod::MHA && std::string(e.what()).find("prefix") != std::string::npos;
          ok &= expected;
          std::printf(" %s %s", std::string(method_name(m)).c_str(), expected ? "n/a (prefix)" : e.what());
        }
      }
      std::printf("\n\n");
    }
    std::printf("%s\n", ok ? "All methods agree with the float64 reference." : "SOME METHODS DISAGREE.");
    rc = ok ? 0 : kExitFailure;
  });
}

}  // namespace mla::cli
