// mla/model.h — the DeepSeek-V2/V3 decoder: embedding; per layer RMSNorm → MLA attention →
// residual → RMSNorm → MLP or MoE → residual; final RMSNorm; lm_head.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "mla/attention.h"
#include "mla/model_config.h"
#include "mla/moe.h"
#include "mla/weights.h"

namespace mla {

struct MlpWeights {
  Tensor gate_proj;  // [I, hidden]
  Tensor up_proj;    // [I, hidden]
  Tensor down_proj;  // [hidden, I]
};

struct MoeWeights {
  Tensor gate;                     // [n_routed_experts, hidden] router
  Tensor e_score_correction_bias;  // [n_routed_experts] (V3; absent for V2)
  std::vector<MlpWeights> experts;
  MlpWeights shared;               // width moe_intermediate_size · n_shared_experts (absent if 0)
};

struct DecoderLayerWeights {
  Tensor input_layernorm, post_attention_layernorm;  // [hidden]
  AttentionWeights self_attn;
  std::optional<MlpWeights> mlp;  // dense layers
  std::optional<MoeWeights> moe;  // MoE layers
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<DecoderLayerWeights> layers;
  Tensor norm;          // [hidden]
  Tensor lm_head;       // [vocab, hidden] (embed_tokens when tied)
};

// Loads every tensor by its HF name (model.layers.N.mlp.experts.E.gate_proj.weight, ...),
// dequantizing block-fp8 weights, converting to `dtype`. A missing or misshapen tensor is an
// Error naming it. Names the checkpoint has but the model does not use are appended to `unused`.
ModelWeights load_model_weights(const ModelConfig& c, const TensorLookup& get,
                                const std::vector<std::string>& names, DType dtype,
                                std::vector<std::string>* unused = nullptr);

// The routing parameters of the config's MoE layers (mla/moe.h).
MoeRouting moe_routing(const ModelConfig& c);

struct ForwardOptions {
  DispatchSettings dispatch;
  std::optional<ForwardMethod> method;  // forced for every batch; nullopt: the dispatcher
};

struct ModelOutput {
  Tensor logits;  // [T, vocab_size] f32, on the platform
  ForwardMethod method = ForwardMethod::MLA;
};

class Model {
 public:
  Model(const ModelConfig& c, const ModelWeights& w, Ops& ops);
  const ModelConfig& config() const { return cfg_; }
  Ops& ops() const { return ops_; }

  // The method this batch runs by: forced, or dispatched and resolved for the platform. Throws
  // Error when it is not implemented or cannot serve the batch.
  ForwardMethod choose_method(const Batch& b, const ForwardOptions& opt) const;
  // Runs the batch through every layer. ids [T]: the new tokens, request after request. The
  // pool (one layer per decoder layer) must hold slots for them (see plan_batch).
  ModelOutput forward(const std::vector<int32_t>& ids, const BatchPlan& plan, KVPool& pool,
                      const ForwardOptions& opt);

 private:
  struct Mlp {
    Tensor gate_proj, up_proj, down_proj;
  };
  struct Layer {
    Tensor input_layernorm, post_attention_layernorm;
    std::unique_ptr<AttentionLayer> attn;
    std::optional<Mlp> mlp;
    Tensor router;  // [E, hidden] f32
    Tensor bias;    // [E] f32 e_score_correction_bias (V3), undefined for V2
    Tensor experts_gate, experts_up;  // [E, I, hidden] stacked routed experts
    Tensor experts_down;              // [E, hidden, I]
    std::optional<Mlp> shared;
  };
  Mlp upload(const MlpWeights& m);
  Tensor mlp(const Mlp& m, const Tensor& x);  // x[n, hidden] → [n, hidden]
  Tensor moe(const Layer& l, const Tensor& x);

  ModelConfig cfg_;
  Ops& ops_;
  MoeRouting routing_;
  Tensor embed_, norm_, lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace mla

namespace mla {

// A model loaded from an HF checkpoint folder (config.json + model.safetensors or a sharded
// index), on the platform of `ops`, in ops.act_dtype(). Checkpoint names the model does not use
// are listed in `unused` (reported, not fatal).
struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Model> model;
  std::vector<std::string> unused;
  int64_t parameters = 0;  // elements of every tensor the model uses
};
LoadedModel load_model(const std::string& dir, Ops& ops);

}  // namespace mla
