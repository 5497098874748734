// text/bpe.cpp — the BPE model of tokenizer.json: vocab, merges by rank, byte fallback, unknown
// tokens; merging with a priority queue over a linked list of symbols (HF's Word::merge_all).
#include <algorithm>
#include <queue>

#include "mla/error.h"
#include "text/tokenizer_impl.h"

namespace mla::text {

void Bpe::add_merge(int32_t a, int32_t b, uint32_t rank, int32_t id) {
  const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 20;
  for (;; ++h) {
    MergeSlot& s = merge_table[h & merge_mask];
    if (s.id < 0 || s.key == key) {  // a repeated pair: the later line wins, as in HF's map
      s = {key, rank, id};
      return;
    }
  }
}

void parse_bpe(const nlohmann::json& m, Bpe& bpe) {
  if (!m.is_object()) fail("tokenizer.json: model is missing or not an object");
  const std::string type = m.value("type", nlohmann::json("BPE")).is_string() ? m.value("type", "BPE") : "";
  if (type != "BPE") fail("tokenizer.json: model.type '{}' is not supported (supported: BPE)", m.value("type", nlohmann::json()).dump());
  auto null_or = [&](const char* key) { return !m.contains(key) || m[key].is_null(); };
  if (!null_or("dropout") && !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
    fail("tokenizer.json: model.dropout {} is not supported (only null)", m["dropout"].dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!null_or(key) && !(m[key].is_string() && m[key].get<std::string>().empty()))
      fail("tokenizer.json: model.{} {} is not supported (only null)", key, m[key].dump());
  auto flag = [&](const char* key) {
    if (null_or(key)) return false;
    if (!m[key].is_boolean()) fail("tokenizer.json: model.{} is not a boolean", key);
    return m[key].get<bool>();
  };
  bpe.fuse_unk = flag("fuse_unk");
  bpe.byte_fallback = flag("byte_fallback");
  bpe.ignore_merges = flag("ignore_merges");

  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("tokenizer.json: model.vocab is missing or not an object");
  const auto& vocab = m["vocab"];
  bpe.vocab.reserve(vocab.size() * 2);
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      fail("tokenizer.json: model.vocab['{}'] is not a non-negative 32-bit id", it.key());
    const auto id = int32_t(it.value().get<int64_t>());
    bpe.vocab[it.key()] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  bpe.vocab_r.assign(size_t(max_id + 1), std::string());
  std::vector<bool> seen(size_t(max_id + 1), false);
  for (const auto& [tok, id] : bpe.vocab) {
    if (seen[size_t(id)]) fail("tokenizer.json: model.vocab: id {} is given to two tokens", id);
    seen[size_t(id)] = true;
    bpe.vocab_r[size_t(id)] = tok;
  }

  if (!null_or("unk_token")) {
    if (!m["unk_token"].is_string()) fail("tokenizer.json: model.unk_token is not a string");
    const std::string unk = m["unk_token"];
    auto it = bpe.vocab.find(unk);
    if (it == bpe.vocab.end()) fail("tokenizer.json: model.unk_token '{}' is not in model.vocab", unk);
    bpe.unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(c, byte_to_cp(uint8_t(b)));
    auto it = bpe.vocab.find(c);
    bpe.byte_ids[b] = it == bpe.vocab.end() ? -1 : it->second;
    auto fb = bpe.vocab.find(fmt::format("<0x{:02X}>", b));
    bpe.fallback_ids[b] = fb == bpe.vocab.end() ? -1 : fb->second;
  }

  if (!m.contains("merges") || !m["merges"].is_array()) fail("tokenizer.json: model.merges is missing or not an array");
  const auto& merges = m["merges"];
  size_t cap = 16;
  while (cap < merges.size() * 2 + 16) cap *= 2;
  bpe.merge_table.assign(cap, {0, 0, -1});
  bpe.merge_mask = cap - 1;
  uint32_t rank = 0;
  for (const auto& line : merges) {
    std::string a, b;
    if (line.is_string()) {
      const std::string s = line;
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) fail("tokenizer.json: model.merges[{}] '{}' is not two tokens", rank, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (line.is_array() && line.size() == 2 && line[0].is_string() && line[1].is_string()) {
      a = line[0];
      b = line[1];
    } else {
      fail("tokenizer.json: model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]", rank);
    }
    auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b), iab = bpe.vocab.find(a + b);
    if (ia == bpe.vocab.end() || ib == bpe.vocab.end())
      fail("tokenizer.json: model.merges[{}]: '{}' is not in model.vocab", rank, ia == bpe.vocab.end() ? a : b);
    if (iab == bpe.vocab.end()) fail("tokenizer.json: model.merges[{}]: the merge '{}' is not in model.vocab", rank, a + b);
    bpe.add_merge(ia->second, ib->second, rank, iab->second);
    ++rank;
  }
}

void Bpe::merge_symbols(std::vector<int32_t>& ids) const {
  const size_t n = ids.size();
  if (n < 2) return;
  struct Sym { int32_t id; int32_t prev, next; bool alive; };
  thread_local std::vector<Sym> syms;
  syms.resize(n);
  for (size_t i = 0; i < n; ++i) syms[i] = {ids[i], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1, true};
  struct Cand { uint32_t rank; int32_t pos; int32_t id; };
  auto worse = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  thread_local std::vector<Cand> heap;
  heap.clear();
  for (size_t i = 0; i + 1 < n; ++i)
    if (const MergeSlot* m = find_merge(syms[i].id, syms[i + 1].id)) heap.push_back({m->rank, int32_t(i), m->id});
  std::make_heap(heap.begin(), heap.end(), worse);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Cand top = heap.back();
    heap.pop_back();
    Sym& cur = syms[size_t(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    Sym& right = syms[size_t(cur.next)];
    const MergeSlot* m = find_merge(cur.id, right.id);
    if (!m || m->id != top.id) continue;  // a stale entry
    cur.id = top.id;
    right.alive = false;
    cur.next = right.next;
    if (right.next >= 0) syms[size_t(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeSlot* pm = find_merge(syms[size_t(cur.prev)].id, cur.id)) {
        heap.push_back({pm->rank, cur.prev, pm->id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
    if (cur.next >= 0) {
      if (const MergeSlot* nm = find_merge(cur.id, syms[size_t(cur.next)].id)) {
        heap.push_back({nm->rank, top.pos, nm->id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) ids.push_back(syms[size_t(i)].id);
}

void Bpe::tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  thread_local std::vector<int32_t> syms;
  syms.clear();
  thread_local std::string chars;
  if (byte_level) {
    if (ignore_merges) {
      chars.clear();
      for (char c : word) append_utf8(chars, byte_to_cp(uint8_t(c)));
      auto it = vocab.find(chars);
      if (it != vocab.end()) { out.push_back(it->second); return; }
    }
    bool all = true;
    for (char c : word) {
      const int32_t id = byte_ids[uint8_t(c)];
      if (id < 0) { all = false; break; }
      syms.push_back(id);
    }
    if (!all) {  // the vocabulary lacks part of the byte alphabet: the general path over characters
      chars.clear();
      for (char c : word) append_utf8(chars, byte_to_cp(uint8_t(c)));
      tokenize(chars, false, out);
      return;
    }
    merge_symbols(syms);
    out.insert(out.end(), syms.begin(), syms.end());
    return;
  }
  if (ignore_merges) {
    auto it = vocab.find(std::string(word));
    if (it != vocab.end()) { out.push_back(it->second); return; }
  }
  // Characters; unknown ones through byte fallback or the unknown token (fused when asked).
  // With no unknown token, an unknown character is dropped, as HF's BPE does.
  std::vector<int32_t> ids;
  bool last_unk = false;
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    const size_t b = i;
    next_cp(word, i);
    ch.assign(word.data() + b, i - b);
    auto it = vocab.find(ch);
    if (it != vocab.end()) {
      ids.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && fallback_ids[uint8_t(c)] >= 0;
      if (all) {
        for (char c : ch) ids.push_back(fallback_ids[uint8_t(c)]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id) {
      if (!(fuse_unk && last_unk)) ids.push_back(*unk_id);
      last_unk = true;
    }
  }
  merge_symbols(ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

// ---- Trie ----

void Trie::add(std::string_view s, int32_t value) {
  if (s.empty()) return;
  uint32_t node = 0;
  for (char c : s) {
    const auto b = uint8_t(c);
    uint32_t next = 0;
    for (auto [k, v] : nodes_[node].next)
      if (k == b) { next = v; break; }
    if (!next) {
      next = uint32_t(nodes_.size());
      nodes_[node].next.emplace_back(b, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  if (nodes_[node].value < 0) nodes_[node].value = value;  // the first token with this content wins
  first_[uint8_t(s[0])] = true;
}

std::pair<size_t, int32_t> Trie::longest_at(std::string_view s, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  uint32_t node = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    const auto b = uint8_t(s[i]);
    uint32_t next = 0;
    for (auto [k, v] : nodes_[node].next)
      if (k == b) { next = v; break; }
    if (!next) break;
    node = next;
    if (nodes_[node].value >= 0) best = {i + 1 - pos, nodes_[node].value};
  }
  return best;
}

}  // namespace mla::text
