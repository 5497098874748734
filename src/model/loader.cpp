// Loading a model from an HF checkpoint folder.
#include <filesystem>

#include "mla/error.h"
#include "mla/model.h"
#include "mla/safetensors.h"

namespace mla {

LoadedModel load_model(const std::string& dir, Ops& ops) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) fail("model folder '{}' does not exist", dir);
  LoadedModel m;
  m.config = load_model_config(dir);
  Checkpoint ck = Checkpoint::open(dir);
  TensorLookup get = [&](const std::string& name) -> std::optional<Tensor> {
    if (!ck.has(name)) return std::nullopt;
    return ck.view(name);
  };
  ModelWeights w = load_model_weights(m.config, get, ck.names(), DType::F32, &m.unused);
  for (const std::string& n : ck.names())
    if (std::find(m.unused.begin(), m.unused.end(), n) == m.unused.end() &&
        n.find("_scale_inv") == std::string::npos) {
      int64_t k = 1;
      for (int64_t d : ck.info(n).shape) k *= d;
      m.parameters += k;
    }
  m.model = std::make_unique<Model>(m.config, w, ops);
  return m;
}

}  // namespace mla
