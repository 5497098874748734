// mla/model.h — the DeepSeek-V2/V3 decoder: embedding; per layer RMSNorm → MLA attention →
// residual → RMSNorm → MLP or MoE → residual; final RMSNorm; lm_head.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mla/attention.h"
#include "mla/communicator.h"
#include "mla/model_config.h"
#include "mla/moe.h"
#include "mla/weights.h"

namespace mla {

// The part of a weight a tensor-parallel rank holds: along `dim` (0: rows, 1: columns of a 2-D
// weight) the slice [start, start + dst.dim(dim)) of the full tensor, which is `full` long there.
// dim < 0: the whole tensor.
struct WeightShard {
  int dim = -1;
  int64_t start = 0, full = 0;
  bool whole() const { return dim < 0; }
  Shape full_shape(const Shape& part) const;  // part's shape with `full` along `dim`
};

// Where a model's weights come from (a checkpoint, random values): each fill() writes the tensor of
// that HF name (model.layers.N.mlp.experts.E.gate_proj.weight, ...), or the shard of it, into `dst`,
// a tensor on the model's platform of the expected shape and dtype. A shard holds exactly the
// values of that slice of the whole tensor. Errors name the tensor.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  // Called once before the fills: how many tensors and bytes will be asked for.
  virtual void begin(int64_t tensors, int64_t bytes) {}
  virtual void fill(const std::string& name, Tensor& dst, const WeightShard& shard) = 0;
  virtual void end() {}  // after the last fill: every write has landed
};

// The routing parameters of the config's MoE layers (mla/moe.h).
MoeRouting moe_routing(const ModelConfig& c);

struct ForwardOptions {
  DispatchSettings dispatch;
  std::optional<ForwardMethod> method;  // forced for every batch; nullopt: the dispatcher
  // Decode steps by MLA replay step graphs where the platform records them (Ops::can_capture) and
  // the tensor-parallel communicator allows it: the same bits as running them op by op.
  bool graphs = true;
};

// Token ids a step reads on the platform (e.g. the last step's sampled ids, not yet on the host):
// token i of the batch is src[from[i]] where from[i] >= 0, else the host's ids[i].
struct DeviceIds {
  Tensor src;                 // [n] I32 on the model's platform
  std::vector<int32_t> from;  // [T] a row of src, or -1
};

struct ModelOutput {
  Tensor logits;  // [T, vocab_size] f32, on the platform
  ForwardMethod method = ForwardMethod::MLA;
};

// Error naming the field when tensor parallelism of size tp does not split the config evenly (heads,
// intermediate sizes).
void check_tensor_parallel(const ModelConfig& c, int tp);

// Tensor parallelism (a Communicator of size tp > 1; rank r): attention heads split across ranks
// (q_b_proj / q_proj / kv_b_proj rows, o_proj columns; each rank's AttentionLayer sees
// num_attention_heads / tp heads, so its handlers do too); the latent projections, norms, router
// and KV cache replicated; dense MLPs and every expert split along the intermediate dimension
// (gate/up rows, down columns); embedding and lm_head split by vocabulary (ceil(V / tp) rows a
// rank, the last shard padded with zero rows). One all_reduce ends each attention and each MLP/MoE
// (fused with the residual add and the next norm), one all_reduce of the embedding, one
// all_gather of the logits: every rank gets the whole logits.
class Model {
 public:
  // Allocates every weight on ops' platform (ops.act_dtype(); the router in f32), then fills them
  // (this rank's shards, with `tp`) from `src` in checkpoint order. Experts are stacked per layer:
  // [n_routed_experts, ...]. A head count or intermediate size that tp does not divide is an Error.
  Model(const ModelConfig& c, WeightSource& src, Ops& ops, Communicator* tp = nullptr);
  int64_t parameters() const { return parameters_; }  // elements of this rank's weights
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  const ModelConfig& config() const { return cfg_; }
  Ops& ops() const { return ops_; }

  // The method this batch runs by: forced, or dispatched and resolved for the platform. Throws
  // Error when it is not implemented or cannot serve the batch.
  ForwardMethod choose_method(const Batch& b, const ForwardOptions& opt) const;
  // Runs the batch through every layer. ids [T]: the new tokens, request after request. The
  // pool (one layer per decoder layer) must hold slots for them (see plan_batch).
  // logit_rows: the rows of the batch whose logits are wanted (nullptr: all T); lm_head runs on
  // those rows only, and ModelOutput::logits has one row per entry.
  //
  // Step graphs (opt.graphs): a DECODE batch run by MLA is recorded the second time its shapes
  // (tokens, requests, logit rows, the plan's kv_bucket) and the Ops's launch_class of the plan come
  // on this pool, and replayed from then on; the first time runs op by op. At most kMaxGraphs are
  // kept (the least recently used go); another pool, or other KV scales, drops them all.
  //
  // device_ids: the tokens it names are read on the platform (Ops::step_rows_from), and their
  // entries of `ids` are only placeholders in the vocabulary. tp 1 only.
  ModelOutput forward(const std::vector<int32_t>& ids, const BatchPlan& plan, KVPool& pool,
                      const ForwardOptions& opt, const std::vector<int32_t>* logit_rows = nullptr,
                      const DeviceIds* device_ids = nullptr);
  static constexpr size_t kMaxGraphs = 64;
  size_t graphs_kept() const { return graphs_.size(); }  // recorded graphs (and shapes seen once)

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
    Mlp experts;    // stacked routed experts: gate_proj, up_proj [E, I, hidden]; down_proj [E, hidden, I]
    std::optional<Mlp> shared;
  };
  Tensor mlp(const Mlp& m, const Tensor& x);  // x[n, hidden] → [n, hidden] (this rank's part of the sum)
  Tensor moe(const Layer& l, const Tensor& x);
  // h[rows, hidden] normalized → out[rows, vocab_size] f32
  void logits(const Tensor& h, Tensor& out);
  // The layers, final norm and lm_head of a planned step (inside its StepScope) → logits[rows, vocab].
  void run(const std::vector<int32_t>& embed_rows, const BatchPlan& plan, KVPool& pool, ForwardMethod method,
           const DispatchSettings& settings, const std::vector<int32_t>* logit_rows, Tensor& logits);
  // The step by its graph (recorded now if it was seen before): the logits, or an undefined tensor
  // when it runs op by op this time.
  Tensor run_graph(const std::vector<int32_t>& embed_rows, const BatchPlan& plan, KVPool& pool, ForwardMethod method,
                   const DispatchSettings& settings, const std::vector<int32_t>* logit_rows);
  struct GraphKey {
    int64_t tokens, requests, rows, kv_bucket;
    int32_t launch_class;
    ForwardMethod method;
    auto operator<=>(const GraphKey&) const = default;
  };
  struct GraphEntry {
    std::unique_ptr<Ops::StepGraph> graph;  // null: seen once
    uint64_t last_use = 0;
  };

  ModelConfig cfg_;
  Ops& ops_;
  Communicator* tp_;
  int64_t parameters_ = 0;
  MoeRouting routing_;
  int64_t vocab_begin_ = 0, vocab_rows_ = 0;  // this rank's vocabulary [begin, begin + rows), ceil(V / tp) a rank
  Tensor embed_;  // [vocab_rows_, hidden]; with tp > 1 one more row of zeros, for ids of other ranks
  Tensor norm_, lm_head_;  // lm_head_ [vocab_rows_, hidden], zero rows past the vocabulary
  std::vector<Layer> layers_;
  // Step graphs: for one pool (its buffers, held while graphs use them) and its scales.
  std::map<GraphKey, GraphEntry> graphs_;
  uint64_t graph_clock_ = 0;
  std::vector<Tensor> graph_pool_;
  std::vector<double> graph_scales_;
  Tensor graph_logits_;  // [capacity, vocab] f32: the graphs' output rows, copied out after a replay
};

}  // namespace mla

namespace mla {

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Model> model;
  std::vector<std::string> unused;  // checkpoint tensors the model does not use
  double seconds = 0;               // the time the weights took
};

// How far a load is (called from the loading thread after each tensor).
struct LoadProgress {
  int64_t tensors = 0, tensors_total = 0;
  int64_t bytes = 0, bytes_total = 0;  // as stored on the platform
  double seconds = 0;                  // since the load began
};
struct LoadOptions {
  std::function<void(const LoadProgress&)> progress;
  Communicator* tp = nullptr;  // this rank's tensor-parallel group: the model holds its shard
  int threads = 0;  // host threads converting weights; 0: every hardware thread
  size_t staging_bytes = size_t(64) << 20;  // each of the three staging buffers
};

// A model from an HF checkpoint folder (config.json + model.safetensors or a sharded index), on
// the platform of `ops`, in ops.act_dtype(): each tensor goes from the memory-mapped file to its
// dtype on many threads and to the platform through page-locked staging buffers, overlapping the
// copies (no host copy of the whole model; on the CPU the staging is plain memory). Block-fp8
// weights are dequantized on the host.
LoadedModel load_model(const std::string& dir, Ops& ops, const LoadOptions& opt = {});

// A model of the config's shape whose weights are generated on the platform, as transformers
// initializes them (std initializer_range, RMSNorm weights 1, e_score_correction_bias 0), from a
// hash of the seed and each tensor's name.
LoadedModel random_model(const ModelConfig& c, Ops& ops, uint64_t seed = 0, const LoadOptions& opt = {});

// The configs of named DeepSeek shapes, as their HF config.json: "deepseek-v2-lite",
// "deepseek-v2", "deepseek-v3"; "NAME:N" keeps the first N layers. Error listing the names.
std::string named_model_config_json(std::string_view spec);
ModelConfig named_model_config(std::string_view spec);
std::vector<std::string> named_model_shapes();

}  // namespace mla
