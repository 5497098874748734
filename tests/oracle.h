// tests/oracle.h — the transformers oracle of a committed test model (tests/data/NAME/oracle*.safetensors,
// described in tests/data/README.md), read into plain vectors.
#pragma once
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mla/safetensors.h"

#ifndef MLA_TEST_DATA
#error "MLA_TEST_DATA must name tests/data"
#endif

namespace mla::test {

struct Oracle {
  std::string dir;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<double>> logits;
  std::vector<int32_t> prompt, greedy;
  std::vector<double> margin, greedy_logits;
  std::vector<std::vector<double>> bf16_logits;  // transformers in bf16, same ids
  std::vector<double> bf16_spread;               // rel L2 of bf16_logits.K against logits.K
};

inline std::vector<int32_t> ids_of(const Tensor& t) {
  std::vector<int32_t> v;
  for (double x : t.to_doubles()) v.push_back(int32_t(x));
  return v;
}

inline Oracle load_oracle(const std::string& name) {
  Oracle o;
  const char* env = std::getenv("MLA_TEST_DATA");  // where the tree moved (e.g. to a GPU machine)
  o.dir = std::string(env ? env : MLA_TEST_DATA) + "/" + name;
  SafetensorsFile f = SafetensorsFile::open(o.dir + "/oracle.safetensors");
  for (int k = 0; f.has(fmt::format("ids.{}", k)); ++k) {
    o.seqs.push_back(ids_of(f.tensor(fmt::format("ids.{}", k))));
    o.logits.push_back(f.tensor(fmt::format("logits.{}", k)).to_doubles());
  }
  o.prompt = ids_of(f.tensor("greedy.prompt"));
  o.greedy = ids_of(f.tensor("greedy.ids"));
  o.margin = f.tensor("greedy.margin").to_doubles();
  o.greedy_logits = f.tensor("greedy.logits").to_doubles();
  SafetensorsFile b = SafetensorsFile::open(o.dir + "/oracle_bf16.safetensors");
  for (size_t k = 0; k < o.seqs.size(); ++k) {
    if (ids_of(b.tensor(fmt::format("ids.{}", k))) != o.seqs[k]) throw std::runtime_error("oracle_bf16: other ids");
    o.bf16_logits.push_back(b.tensor(fmt::format("logits.{}", k)).to_doubles());
    o.bf16_spread.push_back(b.tensor(fmt::format("spread.{}", k)).to_doubles().at(0));
  }
  return o;
}

}  // namespace mla::test
