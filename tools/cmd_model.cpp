// mla logits / generate / inspect / demo — running HF DeepSeek checkpoints.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "mla/compare.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/service.h"
#include "mla/error.h"
#include "mla/platform_ops.h"
#include "mla/safetensors.h"
#include "run_opts.h"
#include "text/tokenizer.h"

namespace mla::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check_ids(const std::vector<int64_t>& ids, const ModelConfig& c, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= c.vocab_size)
      throw UsageError(fmt::format("{}: id {} at index {} is outside the vocabulary [0, {})", what, ids[i], i, c.vocab_size));
}

std::vector<int32_t> to_i32(const std::vector<int64_t>& v) { return std::vector<int32_t>(v.begin(), v.end()); }

std::string join_methods(const std::vector<ForwardMethod>& m) {
  std::string s;
  for (size_t i = 0; i < m.size(); ++i) s += (i ? "," : "") + std::string(method_name(m[i]));
  return s;
}

// One request through the engine's scheduler and sampler, alone: the tokens, the method of every
// batch in order, the logits of every sampled position (when asked), and the time to the first token.
struct Generation {
  std::vector<int32_t> ids;
  std::vector<ForwardMethod> methods;
  std::vector<std::pair<ForwardMode, int64_t>> batches;  // mode and new tokens of each batch
  std::vector<float> logits;
  double ttft = 0, total = 0;
};

Generation generate_one(Engine& engine, const std::vector<int32_t>& prompt, const engine::SamplingParams& params,
                        int64_t prefill_chunk, bool keep_logits, int32_t eos_token_id = -1,
                        bool decode_ahead = true) {
  Generation g;
  engine::SchedulerOptions so;
  so.decode_ahead = decode_ahead;
  so.eos_token_id = eos_token_id;
  so.prefill_chunk = prefill_chunk;
  so.token_budget = std::max<int64_t>(int64_t(prompt.size()), 1);
  so.prefix_cache = false;
  so.on_batch = [&g](ForwardMode m, ForwardMethod f, int64_t n) {
    g.methods.push_back(f);
    g.batches.emplace_back(m, n);
  };
  engine::Scheduler sched(engine, so);
  engine::GenerateRequest req;
  req.prompt = prompt;
  req.params = params;
  std::string error;
  const auto t0 = Clock::now();
  bool first = true;
  sched.add(1, std::move(req), [&](const engine::RequestUpdate& u) {
    if (!u.error.empty()) error = u.error;
    for (const engine::ChoiceUpdate& c : u.choices) {
      if (first && !c.new_tokens.empty()) g.ttft = seconds_since(t0), first = false;
      g.ids.insert(g.ids.end(), c.new_tokens.begin(), c.new_tokens.end());
    }
  }, keep_logits ? engine::LogitsHook([&g](int64_t, const float* l, int64_t V) { g.logits.insert(g.logits.end(), l, l + V); })
                 : engine::LogitsHook());
  while (sched.step()) {
  }
  g.total = seconds_since(t0);
  if (!error.empty()) throw Error(error);
  return g;
}

std::vector<int64_t> read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("--prompt-file: cannot open '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int64_t> ids = parse_id_text(ss.str(), "--prompt-file");
  if (ids.empty()) throw UsageError(fmt::format("--prompt-file: '{}' holds no ids", path));
  return ids;
}

}  // namespace

void add_logits_command(CLI::App& app, int& rc) {
  struct Opts : RunOpts {
    std::string ids, out, compare;
    int64_t prefill_chunk = 0, decode_from = -1;
    double tolerance = 1e-4;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("logits", "Logits of every position of a sequence, to a safetensors file");
  o->add(sub);
  sub->add_option("--ids", o->ids, "token ids, e.g. 5,17,42")->required();
  sub->add_option("--prefill-chunk", o->prefill_chunk, "feed the prompt N tokens at a time (0: all at once)")->capture_default_str();
  sub->add_option("--decode-from", o->decode_from, "feed tokens K.. one at a time in DECODE mode (default: none)");
  sub->add_option("--out", o->out, "output safetensors file (tensor 'logits', F32 [n, vocab])")->required();
  sub->add_option("--compare", o->compare,
                  "FILE:TENSOR, e.g. oracle.safetensors:logits.0: check the logits against that [n, vocab] tensor "
                  "(relative L2; an all-zero or non-finite result never passes); exit 1 and no --out past --tolerance");
  sub->add_option("--tolerance", o->tolerance, "relative L2 tolerance of --compare")->capture_default_str();
  sub->callback([o, &rc] {
    o->parse();
    std::vector<int64_t> ids = parse_int_list(o->ids, "--ids");
    if (ids.empty()) throw UsageError("--ids: no token ids given");
    if (o->prefill_chunk < 0) throw UsageError("--prefill-chunk must be >= 0");
    const int64_t n = int64_t(ids.size());
    const int64_t decode_from = o->decode_from < 0 ? n : o->decode_from;
    if (decode_from > n) throw UsageError(fmt::format("--decode-from {} is past the {} ids", decode_from, n));
    Session s = open_session(*o, n);
    check_ids(ids, s.lm.config, "--ids");
    const auto t0 = Clock::now();
    Engine::Run run = s.engine->run_sequence(to_i32(ids), o->prefill_chunk, decode_from);
    const double dt = seconds_since(t0);
    const int64_t V = s.lm.config.vocab_size;
    Tensor logits = Tensor::host(DType::F32, {n, V});
    std::copy(run.logits.begin(), run.logits.end(), logits.ptr<float>());
    std::string verdict;
    if (!o->compare.empty()) {
      const size_t colon = o->compare.rfind(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == o->compare.size())
        throw UsageError(fmt::format("--compare '{}': expected FILE:TENSOR", o->compare));
      const std::string file = o->compare.substr(0, colon), name = o->compare.substr(colon + 1);
      SafetensorsFile ref_file = SafetensorsFile::open(file);
      if (!ref_file.has(name)) fail("--compare: {} has no tensor '{}'", file, name);
      const Tensor ref = ref_file.tensor(name);
      if (ref.numel() != logits.numel())
        fail("--compare: tensor '{}' of {} has {} values, the logits {} ([{}, {}])", name, file, ref.numel(),
             logits.numel(), long(n), long(V));
      const double err = rel_l2(logits.to_doubles(), ref.to_doubles());
      const bool pass = err <= o->tolerance;
      verdict = fmt::format("; vs {}: relative L2 {:.2e} (tolerance {:.0e}) {}", name, err, o->tolerance, pass ? "PASS" : "FAIL");
      if (!pass) fail("logits differ from {} in {}: relative L2 {:.3e} > tolerance {:.0e}", name, file, err, o->tolerance);
    }
    write_safetensors(o->out, {{"logits", logits}}, {{"methods", join_methods(run.methods)}});
    std::fprintf(stderr, "mla: %ld tokens in %zu batches, %.3f s (%.1f tokens/s)\n", long(n), run.methods.size(), dt, n / dt);
    std::printf("wrote %s: logits [%ld, %ld]; methods %s%s\n", o->out.c_str(), long(n), long(V),
                join_methods(run.methods).c_str(), verdict.c_str());
    rc = 0;
  });
}

void add_generate_command(CLI::App& app, int& rc) {
  struct Opts : RunOpts {
    std::string ids, prompt_file, prompt, messages_file, tokenizer;
    int64_t max_new = 16, prefill_chunk = 0;
    bool ignore_eos = false;
    double temperature = 0, top_p = 1.0, min_p = 0;
    int64_t top_k = 0;
    uint64_t seed = 0;
    bool json = false, no_decode_ahead = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("generate", "Generate tokens (greedy unless a temperature is given)");
  o->add(sub);
  auto* ids_opt = sub->add_option("--ids", o->ids, "prompt token ids, e.g. 5,17,42");
  auto* file_opt = sub->add_option("--prompt-file", o->prompt_file, "a file of prompt ids (commas or whitespace)");
  auto* text_opt = sub->add_option("--prompt", o->prompt, "a text prompt, through the model's tokenizer");
  auto* msgs_opt = sub->add_option("--messages-file", o->messages_file,
                                   "a JSON array of chat messages, through the model's chat template");
  sub->add_option("--tokenizer", o->tokenizer, "folder of tokenizer.json + tokenizer_config.json (default: --model)");
  sub->add_flag("--ignore-eos", o->ignore_eos, "text prompts: go on past the model's eos token");
  ids_opt->excludes(file_opt)->excludes(text_opt)->excludes(msgs_opt);
  file_opt->excludes(text_opt)->excludes(msgs_opt);
  text_opt->excludes(msgs_opt);
  sub->add_option("--max-new-tokens", o->max_new, "tokens to generate")->capture_default_str();
  sub->add_option("--temperature", o->temperature, "sampling temperature (default: greedy)");
  sub->add_option("--top-p", o->top_p, "nucleus sampling mass")->capture_default_str();
  sub->add_option("--top-k", o->top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  sub->add_option("--min-p", o->min_p, "drop tokens below min-p times the best one's probability")->capture_default_str();
  sub->add_option("--seed", o->seed, "sampling seed (same seed, same tokens)")->capture_default_str();
  sub->add_option("--prefill-chunk", o->prefill_chunk, "prefill N prompt tokens per batch (0: all)")->capture_default_str();
  sub->add_flag("--json", o->json, "{\"ids\": [...], \"methods\": [...], \"tokens_per_s\": ...} on stdout");
  sub->add_flag("--no-decode-ahead", o->no_decode_ahead,
                "decode step by step: no step issued before the last one's token reaches the host (the same tokens)");
  sub->callback([o, &rc] {
    o->parse();
    const bool text_mode = !o->prompt.empty() || !o->messages_file.empty();
    if (!text_mode && o->ids.empty() == o->prompt_file.empty())
      throw UsageError("give the prompt with --ids, --prompt-file, --prompt or --messages-file");
    std::optional<text::Tokenizer> tok;
    std::vector<int64_t> prompt;
    if (text_mode) {
      const std::string dir = o->tokenizer.empty() ? o->model : o->tokenizer;
      if (dir.empty()) throw UsageError("a text prompt needs --tokenizer DIR (random weights come without one)");
      const TextPrompt tp = text_prompt(dir, o->prompt, o->messages_file);
      tok = text::Tokenizer::load(dir);
      prompt.assign(tp.ids.begin(), tp.ids.end());
    } else {
      prompt = o->ids.empty() ? read_prompt_file(o->prompt_file) : parse_int_list(o->ids, "--ids");
    }
    if (prompt.empty()) throw UsageError("the prompt has no tokens");
    if (o->max_new < 0) throw UsageError("--max-new-tokens must be >= 0");
    if (o->temperature < 0 || !(o->top_p > 0 && o->top_p <= 1)) throw UsageError("--temperature must be >= 0 and --top-p in (0, 1]");
    if (o->top_k < 0 || !(o->min_p >= 0 && o->min_p <= 1)) throw UsageError("--top-k must be >= 0 and --min-p in [0, 1]");
    if (o->prefill_chunk < 0) throw UsageError("--prefill-chunk must be >= 0");
    Session s = open_session(*o, int64_t(prompt.size()) + o->max_new);
    check_ids(prompt, s.lm.config, text_mode ? "the tokenized prompt" : "--ids");
    std::vector<int32_t> out;
    std::vector<ForwardMethod> methods;
    double t_prefill = 0, t_decode = 0;
    if (o->max_new == 0) {  // the prefill alone
      const auto t0 = Clock::now();
      methods = s.engine->run_sequence(to_i32(prompt), o->prefill_chunk, int64_t(prompt.size())).methods;
      t_prefill = seconds_since(t0);
    } else {
      engine::SamplingParams sp;
      sp.temperature = o->temperature;
      sp.top_p = o->top_p;
      sp.top_k = o->top_k;
      sp.min_p = o->min_p;
      sp.seed = o->seed;
      sp.max_tokens = o->max_new;
      // Token-id prompts generate exactly --max-new-tokens; text prompts stop at the model's eos.
      sp.ignore_eos = !text_mode || o->ignore_eos;
      Generation g = generate_one(*s.engine, to_i32(prompt), sp, o->prefill_chunk, false,
                                  text_mode ? engine::read_eos_token_id(o->model, s.lm.config.vocab_size) : -1,
                                  !o->no_decode_ahead);
      out = std::move(g.ids);
      methods = std::move(g.methods);
      t_prefill = g.ttft;
      t_decode = g.total - g.ttft;
    }
    // The first token comes with the prefill; a text prompt may stop before --max-new-tokens.
    const int64_t decoded = std::max<int64_t>(int64_t(out.size()) - 1, 0);
    const double tps = decoded > 0 ? double(decoded) / t_decode : 0.0;
    std::fprintf(stderr, "mla: prefill %zu tokens %.3f s; decode %ld tokens %.3f s (%.1f tokens/s)\n", prompt.size(),
                 t_prefill, long(decoded), t_decode, tps);
    if (o->json) {
      nlohmann::ordered_json j;
      if (tok) {
        j["prompt_ids"] = prompt;
        j["text"] = tok->decode(out, /*skip_special_tokens=*/false);
      }
      j["ids"] = out;
      j["methods"] = nlohmann::json::array();
      for (ForwardMethod m : methods) j["methods"].push_back(method_name(m));
      j["tokens_per_s"] = tps;
      std::printf("%s\n", j.dump().c_str());
    } else if (tok) {
      const std::string text = tok->decode(out, /*skip_special_tokens=*/false);
      std::printf("%s\n", text.c_str());
    } else {
      std::string line;
      for (size_t i = 0; i < out.size(); ++i) line += (i ? "," : "") + std::to_string(out[i]);
      std::printf("%s\n", line.c_str());
    }
    rc = 0;
  });
}

// The HF config.json of a named shape, as --random-weights builds it (e.g. to make a checkpoint
// of that shape with transformers).
void add_shape_command(CLI::App& app, int& rc) {
  auto spec = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("shape", "Print the config.json of a named model shape (see --random-weights)");
  sub->add_option("name", *spec, "deepseek-v2-lite | deepseek-v2 | deepseek-v3, optionally NAME:N (N layers)")->required();
  sub->callback([spec, &rc] {
    std::printf("%s\n", named_model_config_json(*spec).c_str());
    rc = 0;
  });
}

void add_inspect_command(CLI::App& app, int& rc) {
  auto model = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("inspect", "Config summary, tensor table, parameter count, KV bytes per token");
  sub->add_option("--model", *model, "HF checkpoint folder")->required();
  sub->callback([model, &rc] {
    ModelConfig c = load_model_config(*model);
    Checkpoint ck = Checkpoint::open(*model);
    const AttentionConfig& a = c.attn;
    std::printf("model_type %s: %ld layers, hidden %ld, vocab %ld, %ld heads\n", c.model_type().c_str(),
                long(c.num_hidden_layers), long(c.hidden_size()), long(c.vocab_size), long(a.num_attention_heads));
    std::printf("attention: q_lora_rank %s, kv_lora_rank %ld, qk_nope %ld, qk_rope %ld, v %ld, softmax scale %.6f\n",
                a.has_q_lora() ? std::to_string(a.q_lora_rank).c_str() : "null", long(a.kv_lora_rank),
                long(a.qk_nope_head_dim), long(a.qk_rope_head_dim), long(a.v_head_dim), a.softmax_scale());
    std::printf("rope: theta %g, %s", a.rope_theta, a.rope_scaling.type.c_str());
    if (a.rope_scaling.type == "yarn")
      std::printf(" factor %g, original %ld, mscale %g, mscale_all_dim %g", a.rope_scaling.factor,
                  long(a.rope_scaling.original_max_position_embeddings), a.rope_scaling.mscale, a.rope_scaling.mscale_all_dim);
    std::printf(", %s pairs\n", a.rope_interleave ? "interleaved" : "NeoX");
    if (c.n_routed_experts > 0)
      std::printf("moe: %ld routed experts (top %ld, %ld groups keep %ld, %s/%s), %ld shared, width %ld, dense layers %ld, scaling %g%s\n",
                  long(c.n_routed_experts), long(c.num_experts_per_tok), long(c.n_group), long(c.topk_group),
                  c.scoring_func.c_str(), c.topk_method.c_str(), long(c.n_shared_experts), long(c.moe_intermediate_size),
                  long(c.first_k_dense_replace), c.routed_scaling_factor, c.norm_topk_prob ? ", renormalized" : "");
    std::printf("kv cache per token: %ld values; %ld bytes bf16, %ld bytes fp8\n", long(c.kv_bytes_per_token(1)),
                long(c.kv_bytes_per_token(2)), long(c.kv_bytes_per_token(1)));
    int64_t params = 0;
    std::printf("%-64s %-8s %s\n", "tensor", "dtype", "shape");
    for (const std::string& n : ck.names()) {
      const auto& info = ck.info(n);
      int64_t k = 1;
      for (int64_t d : info.shape) k *= d;
      params += k;
      std::printf("%-64s %-8s %s\n", n.c_str(), info.st_dtype.c_str(), shape_str(info.shape).c_str());
    }
    std::printf("%zu tensors, %ld parameters (%.3fM)\n", ck.names().size(), long(params), params / 1e6);
    rc = 0;
  });
}

}  // namespace mla::cli

namespace mla::cli {

// The main job: generate with the embedded default model and show, in a few lines, the tokens,
// the method of every step, the speed, and the agreement with transformers' logits.
void add_demo_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<RunOpts>();
  o->model = MLA_DEFAULT_MODEL;
  CLI::App* sub = app.add_subcommand("demo", "Generate with the embedded DeepSeek-V3 test model, checked against transformers");
  o->add(sub, /*model_required=*/false, /*allow_random=*/false);
  sub->callback([o, &rc] {
    o->parse();
    SafetensorsFile oracle = SafetensorsFile::open(o->model + "/oracle.safetensors");
    auto ids = [&](const std::string& n) {
      std::vector<int32_t> v;
      for (double x : oracle.tensor(n).to_doubles()) v.push_back(int32_t(x));
      return v;
    };
    const std::vector<int32_t> prompt = ids("greedy.prompt"), hf_ids = ids("greedy.ids");
    const std::vector<double> hf_logits = oracle.tensor("greedy.logits").to_doubles();
    const int64_t n_new = int64_t(hf_ids.size());
    Session s = open_session(*o, 256);
    const ModelConfig& c = s.lm.config;
    std::printf("mla demo: %s — a random %s checkpoint made with transformers (%ld layers, hidden %ld, %ld heads,\n"
                "kv_lora_rank %ld, %ld routed experts top-%ld), run on %s in %s with a %s latent KV cache.\n\n",
                o->model.c_str(), c.model_type().c_str(), long(c.num_hidden_layers), long(c.hidden_size()),
                long(c.attn.num_attention_heads), long(c.attn.kv_lora_rank), long(c.n_routed_experts),
                long(c.num_experts_per_tok), o->platform.platform.c_str(), o->dtypes.dtype.c_str(), o->dtypes.kv_dtype.c_str());
    // Greedy generation through the scheduler: prefill in two chunks (so the second has a
    // prefix), then decode.
    const int64_t first = (int64_t(prompt.size()) + 1) / 2;
    engine::SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = n_new;
    sp.ignore_eos = true;
    Generation g = generate_one(*s.engine, prompt, sp, first, /*keep_logits=*/true);
    const std::vector<int32_t>& out = g.ids;
    const std::vector<double> logits(g.logits.begin(), g.logits.end());
    std::vector<std::string> methods;
    int64_t seen = 0, decodes = 0;
    ForwardMethod decode_method = ForwardMethod::MLA;
    for (size_t i = 0; i < g.batches.size(); ++i) {
      const auto [mode, n] = g.batches[i];
      if (mode == ForwardMode::DECODE) {
        ++decodes;
        decode_method = g.methods[i];
      } else if (seen == 0) {
        methods.push_back(fmt::format("prefill {} tokens: {}", n, method_name(g.methods[i])));
      } else {
        methods.push_back(fmt::format("extend {} tokens after a {}-token prefix: {}", n, seen, method_name(g.methods[i])));
      }
      if (mode != ForwardMode::DECODE) seen += n;
    }
    methods.push_back(fmt::format("decode {} steps, one token each: {}", decodes, method_name(decode_method)));
    const double t_prefill = g.ttft, t_decode = g.total - g.ttft;
    auto join = [](const std::vector<int32_t>& v) {
      std::string t;
      for (int32_t x : v) t += (t.empty() ? "" : " ") + std::to_string(x);
      return t;
    };
    const double err = rel_l2(logits, hf_logits);
    // transformers ran in float32: f32 must match to 1e-4; bf16 storage costs ~1e-2.
    const double tol = o->act == DType::F32 ? 1e-4 : 5e-2;
    const bool same = out == hf_ids;
    // The model folder's own tokenizer, when it has one, shows the prompt and the output as text
    // (random weights: the text is nonsense, but it is the text transformers' ids stand for).
    std::optional<text::Tokenizer> tok;
    if (std::ifstream(o->model + "/tokenizer.json").good()) tok = text::Tokenizer::load(o->model);
    auto quoted = [&](const std::vector<int32_t>& v) {
      return nlohmann::json(tok->decode(v, /*skip_special_tokens=*/false)).dump(-1, ' ', false,
                                                                           nlohmann::json::error_handler_t::replace);
    };
    if (tok) std::printf("prompt text     %s\n", quoted(prompt).c_str());
    std::printf("prompt ids      %s\n", join(prompt).c_str());
    if (tok) std::printf("generated text  %s\n", quoted(out).c_str());
    std::printf("generated ids   %s\n", join(out).c_str());
    std::printf("transformers    %s  (%s)\n", join(hf_ids).c_str(), same ? "identical" : "DIFFERENT");
    for (const std::string& m : methods) std::printf("method          %s\n", m.c_str());
    std::printf("speed           prefill %.2f ms; decode %.1f tokens/s\n", t_prefill * 1e3, (n_new - 1) / t_decode);
    std::printf("logits vs transformers (float32): relative L2 %.2e over %ld steps (tolerance %.0e)\n", err,
                long(n_new), tol);
    const bool ok = same && err <= tol;
    std::printf("%s\n", ok ? "OK: same tokens, same logits." : "MISMATCH with transformers.");
    rc = ok ? 0 : kExitFailure;
  });
}

}  // namespace mla::cli
