// mla tokenize / detokenize — the HF tokenizer.json tokenizer from the command line.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "mla/error.h"
#include "text/tokenizer.h"

namespace mla::cli {
namespace {

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError(fmt::format("{}: cannot read '{}'", what, path));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> read_lines(const std::string& path, const char* what) {
  const std::string all = read_text_file(path, what);
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    if (nl == std::string::npos) nl = all.size();
    lines.push_back(all.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

// Encode with bad text (invalid UTF-8) as a usage error.
std::vector<int32_t> encode_text(const text::Tokenizer& t, const std::string& s, bool special, const std::string& where) {
  try {
    return t.encode(s, special);
  } catch (const Error& e) {
    throw UsageError(where.empty() ? std::string(e.what()) : fmt::format("{}: {}", where, e.what()));
  }
}

std::string decode_ids(const text::Tokenizer& t, const std::vector<int32_t>& ids, bool skip, const std::string& where) {
  try {
    return t.decode(ids, skip);
  } catch (const Error& e) {
    throw UsageError(where.empty() ? std::string(e.what()) : fmt::format("{}: {}", where, e.what()));
  }
}

using Clock = std::chrono::steady_clock;

// --bench: encode MB/s of the texts, one thread and all threads (JSON on stdout).
void run_bench(const text::Tokenizer& t, const std::vector<std::string>& texts, bool special, double seconds) {
  size_t bytes = 0;
  for (const auto& s : texts) bytes += s.size();
  if (bytes == 0) throw UsageError("--bench: no text");
  auto time_it = [&](auto&& body) {
    body();  // warm: the word cache is part of the steady state, as in HF
    int reps = 0;
    const auto t0 = Clock::now();
    double el = 0;
    do {
      body();
      ++reps;
      el = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (el < seconds);
    return double(bytes) * reps / el / 1e6;
  };
  size_t tokens = 0;
  for (const auto& s : texts) tokens += encode_text(t, s, special, "").size();
  const double single = time_it([&] {
    for (const auto& s : texts) t.encode(s, special);
  });
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const double batch = time_it([&] { t.encode_batch(texts, special, int(hw)); });
  nlohmann::json j = {{"texts", texts.size()}, {"bytes", bytes}, {"tokens", tokens},
                      {"single_thread_MBps", single}, {"batch_threads", hw}, {"batch_MBps", batch}};
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string dir, text, text_file, jsonl;
    bool special = false, text_given = false;
    double bench = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("tokenize", "Text → token ids with an HF tokenizer.json (ids as a JSON array)");
  sub->add_option("--tokenizer", o->dir, "folder with tokenizer.json (and tokenizer_config.json)")->required();
  auto* t1 = sub->add_option("--text", o->text, "the text");
  auto* t2 = sub->add_option("--text-file", o->text_file, "a file holding the text (all of it, as it is)");
  auto* t3 = sub->add_option("--jsonl", o->jsonl, "a file of JSON strings, one a line: one id array a line out");
  t1->excludes(t2)->excludes(t3);
  t2->excludes(t3);
  sub->add_flag("--add-special-tokens", o->special, "add what the tokenizer adds around a text (e.g. BOS)");
  sub->add_option("--bench", o->bench, "time encoding for this many seconds per measure (JSON out)")->group("");
  sub->callback([o, t1, &rc] {
    const bool has_text = t1->count() > 0;
    if (int(has_text) + int(!o->text_file.empty()) + int(!o->jsonl.empty()) != 1)
      throw UsageError("give the text with --text, --text-file or --jsonl");
    const text::Tokenizer tok = text::Tokenizer::load(o->dir);
    if (!o->jsonl.empty()) {
      const auto lines = read_lines(o->jsonl, "--jsonl");
      std::vector<std::string> texts;
      for (size_t i = 0; i < lines.size(); ++i) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(lines[i]);
        } catch (const nlohmann::json::exception& e) {
          throw UsageError(fmt::format("--jsonl line {}: not a JSON string: {}", i + 1, e.what()));
        }
        if (!j.is_string()) throw UsageError(fmt::format("--jsonl line {}: not a JSON string", i + 1));
        texts.push_back(j.get<std::string>());
      }
      if (o->bench > 0) return run_bench(tok, texts, o->special, o->bench);
      std::vector<std::vector<int32_t>> ids;
      try {
        ids = tok.encode_batch(texts, o->special);
      } catch (const Error& e) {
        throw UsageError(fmt::format("--jsonl: {}", e.what()));
      }
      std::string out;
      for (const auto& v : ids) out += ids_json(v) + "\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
      return;
    }
    const std::string text = has_text ? o->text : read_text_file(o->text_file, "--text-file");
    if (o->bench > 0) return run_bench(tok, {text}, o->special, o->bench);
    std::printf("%s\n", ids_json(encode_text(tok, text, o->special, has_text ? "--text" : "--text-file")).c_str());
    rc = 0;
  });
}

void add_detokenize_command(CLI::App& app, int& rc) {
  struct Opts {
    std::string dir, ids, jsonl;
    bool skip = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("detokenize", "Token ids → text with an HF tokenizer.json");
  sub->add_option("--tokenizer", o->dir, "folder with tokenizer.json (and tokenizer_config.json)")->required();
  auto* i1 = sub->add_option("--ids", o->ids, "token ids, e.g. 5,17,42");
  auto* i2 = sub->add_option("--jsonl", o->jsonl, "a file of JSON id arrays, one a line: one JSON string a line out");
  i1->excludes(i2);
  sub->add_flag("--skip-special-tokens", o->skip, "leave special tokens out of the text");
  sub->callback([o, i1, &rc] {
    if ((i1->count() > 0) == !o->jsonl.empty()) throw UsageError("give the ids with --ids or --jsonl");
    const text::Tokenizer tok = text::Tokenizer::load(o->dir);
    auto to_i32 = [](const std::vector<int64_t>& v, const std::string& where) {
      std::vector<int32_t> out;
      for (int64_t x : v) {
        if (x > INT32_MAX) throw UsageError(fmt::format("{}: token id {} is not in the vocabulary", where, x));
        out.push_back(int32_t(x));
      }
      return out;
    };
    if (o->jsonl.empty()) {
      const auto ids = to_i32(o->ids.empty() ? std::vector<int64_t>{} : parse_int_list(o->ids, "--ids"), "--ids");
      const std::string text = decode_ids(tok, ids, o->skip, "--ids");
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
      return;
    }
    const auto lines = read_lines(o->jsonl, "--jsonl");
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string where = fmt::format("--jsonl line {}", i + 1);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(lines[i]);
      } catch (const nlohmann::json::exception& e) {
        throw UsageError(fmt::format("{}: not a JSON array of ids: {}", where, e.what()));
      }
      if (!j.is_array()) throw UsageError(fmt::format("{}: not a JSON array of ids", where));
      std::vector<int32_t> ids;
      for (const auto& x : j) {
        if (!x.is_number_integer()) throw UsageError(fmt::format("{}: {} is not a token id", where, x.dump()));
        const auto v = x.get<int64_t>();
        if (v < 0 || v > INT32_MAX) throw UsageError(fmt::format("{}: token id {} is not in the vocabulary", where, v));
        ids.push_back(int32_t(v));
      }
      out += nlohmann::json(decode_ids(tok, ids, o->skip, where)).dump(-1, ' ', false) + "\n";
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    rc = 0;
  });
}

}  // namespace mla::cli
