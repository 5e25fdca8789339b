// The exported folder (manifest.json, checked like spot.folder.manifest.load_manifest) and the target engine over
// target.onnx: prefill, block logits of N candidate states, store; the KV cache is kept exactly as
// spot/engines/ort_engine.py keeps it (per layer K and V [Hkv, C, D] in the model dtype, fed in place as the
// graph's past_k_<l> / past_v_<l>, each stored block appended on axis C): in host memory, or where the target runs
// (OrtValues appended layer by layer by the export's kv_append.onnx).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "json.h"
#include "ort.h"
#include "spot/spot.h"
#include "step.h"

namespace spot {

struct ModelFacts {             // ModelConfig fields the host needs (manifest["model"])
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, head_dim = 0, max_position_embeddings = 0, block_size = 0, mask_token_id = 0;
  std::vector<int64_t> stop_ids;
};

struct ExportedFolder {
  std::string folder;
  Json manifest;
  ModelFacts config;
  std::string dtype;            // fp32 | fp16
  int64_t block_size = 0, max_nodes = 0, max_context = 0;
  std::string target_graph;     // absolute path of target.onnx
  std::string epilogue_graph;   // absolute path of epilogue.onnx; empty: the export has no sampling epilogue
  int64_t epilogue_steps = 0;   // its future steps D (the deepest tree it serves)
  int64_t epilogue_positions = 0;   // a state's positions per call (positions_per_call); 0: not recorded
  std::string kv_append_graph;  // absolute path of kv_append.onnx
  // the target session's config entries (manifest "ort_session_config": a quantized export keeps ORT's fused
  // MatMulNBits on float32 activations), applied as the Python engine applies them
  std::vector<std::pair<std::string, std::string>> ort_session_config;
};

// Where F's sampling runs and where the KV cache lives (spot.engines.ort_sessions.on_device). Sampling: host = the
// logits come to the host loop; device = the export's sampling epilogue runs next to the target and only its
// samples come back. KV cache: host = host memory, sent with every pass; device = OrtValues where the target runs,
// appended there by kv_append.onnx. auto = device on a GPU provider when the folder has that graph.
enum class Placement { kAuto, kHost, kDevice };

// Logits [N, B, V] float32 in the host memory ORT returned them in: never copied (16 x 32 x 151936 values are
// ~300 MB for SDAR's vocabulary).
class HostLogits {
 public:
  // first: the elements before the states' own rows (a fused store pass: its stored block's B x V)
  explicit HostLogits(OrtOutput out, size_t first = 0) : out_(std::move(out)), first_(first) {}
  const float* data() const { return static_cast<const float*>(out_.data()) + first_; }

 private:
  OrtOutput out_;
  size_t first_;
};

// The sampling epilogue's results for N states (spot.folder.epilogue.EpilogueResult), on the host; the engine
// samples one state per call (n = 1).
struct EpilogueResult {
  int64_t n = 0, b = 0, d = 0;
  std::vector<int64_t> token;             // [N, B] F's sample at each state's step
  std::vector<double> confidence;         // [N, B]
  std::vector<int64_t> future_tokens;     // [N, D, B] coupled samples at steps step+1 .. step+D
  std::vector<double> future_conf;        // [N, D, B]
  std::vector<float> top_logprobs;        // [N, B, 32]
  std::vector<int64_t> future_runner_up;  // [N, D, B]
  std::vector<double> future_gap;         // [N, D, B]
};


// Open and verify a folder (SpotException naming the file when absent, foreign or changed).
ExportedFolder load_exported_folder(const std::string& folder, spot_verify verify);

// TensorRT engine cache of a folder, as spot.engines.ort_sessions.trt_cache_dir: $SPOT_CACHE (default
// ~/.cache/spot)/trt/<first 16 hex of the manifest's sha256>, outside the (possibly read-only) exported folder;
// the session creates it once the TensorRT provider is there.
std::string trt_cache_dir(const ExportedFolder& folder);

// The sessions of one opened folder: the target graph's, and the device sampler's epilogue and the device cache's
// kv_append where they are used, with the facts every pass needs. Made once and never changed: TargetEngines over one
// TargetGraphs (spot_context_open) hold the weights once and decode at the same time, each with its own KV cache
// (as spot.engines.ort_sessions.OrtSessions).
class TargetGraphs {
 public:
  TargetGraphs(const ExportedFolder& folder, int threads, Device device = Device::kCpu,
               Placement sampler = Placement::kAuto, Placement kv_cache = Placement::kAuto);
  TargetGraphs(const TargetGraphs&) = delete;
  TargetGraphs& operator=(const TargetGraphs&) = delete;

  ModelFacts cfg;
  int64_t b, max_context, max_nodes;
  int64_t prefill_chunk = 0;   // tokens per prefill pass; 0: max_nodes x B (device trt: the profile's, one block)
  size_t elem;                 // bytes per K/V element (4 fp32, 2 fp16)
  ONNXTensorElementDataType kv_type;
  std::vector<std::string> past_names;       // past_k_0, past_v_0, past_k_1, ... (spot.folder.manifest)
  std::unique_ptr<OrtSessionHandle> session;
  std::unique_ptr<OrtSessionHandle> epilogue;   // the device sampler's epilogue; null: host sampling
  std::unique_ptr<OrtSessionHandle> kv_append;  // the device cache's append (one layer); null: the host cache
  std::unique_ptr<MemoryPlace> place;           // where the target's logits / new K/V stay on the device
  std::unique_ptr<MemoryPlace> host_place;      // host memory (a fused pass's new K/V with the device cache)
  int64_t epilogue_steps = 0;
  int64_t epilogue_positions = 0;               // positions per epilogue call (the manifest's positions_per_call)
  std::string epilogue_graph_path;

 private:
  void open_epilogue(const ExportedFolder& f, int threads, Device device, Placement sampler);
  void open_kv_append(const ExportedFolder& f, int threads, Device device, Placement kv_cache);
  void make_place(Device device);               // once
};

// One decoder's target: prefill, block logits, store over its own KV cache, running the shared graphs. One request
// at a time per TargetEngine; TargetEngines over the same graphs may run on different threads at once.
class TargetEngine {
 public:
  explicit TargetEngine(std::shared_ptr<const TargetGraphs> graphs);
  TargetEngine(const ExportedFolder& folder, int threads, Device device = Device::kCpu,
               Placement sampler = Placement::kAuto, Placement kv_cache = Placement::kAuto);

  const std::shared_ptr<const TargetGraphs>& graphs() const { return graphs_; }
  int64_t block_size() const { return b_; }
  int64_t vocab() const { return cfg_.vocab_size; }
  int64_t cached_len() const { return cached_; }
  int64_t max_context() const { return max_context_; }
  int64_t max_nodes() const { return max_nodes_; }
  bool cache_on_device() const { return graphs_->kv_append != nullptr; }

  void prefill(const std::vector<int64_t>& ids);             // resets the cache; ids.size() % B == 0
  // logits [N, B, V] float32 of N states [N*B] after the cache; stores nothing
  // The non-finite logits error unless rows[0 .. count) are all finite (the block at the current position).
  void check_finite_rows(const float* rows, size_t count) const;
  // check_finite false: the caller checks each state's rows when it reads them (HostPassOutputs)
  HostLogits block_logits(const std::vector<int64_t>& states, int64_t n, bool check_finite = true);
  void store(const std::vector<int64_t>& state);             // appends the finished block's K/V
  // The fused store pass (decode.py's state_pass with a pending block): store [B] and state [B] as 2B tokens with
  // the block-causal mask; store's K/V appended to the cache, the state's logits [1, B, V] returned — on the host
  // (block_logits' form, check_finite false) or, with the device sampler, where the target ran (its row 1 is the
  // state's: sample_state(logits, 1, ...)).
  HostLogits fused_logits(const std::vector<int64_t>& store, const std::vector<int64_t>& state);
  OrtOutput fused_device_logits(const std::vector<int64_t>& store, const std::vector<int64_t>& state);
  // with the device sampler: a pass over N states [N*B] keeps its logits [N, B, V] where the target ran, and the
  // epilogue samples one of them (row `row`, block state `state` [B], commit step `step`) when the host reads it
  bool samples_on_device() const { return graphs_->epilogue != nullptr; }
  int64_t sampler_depth() const { return graphs_->epilogue_steps; }  // 0 without the device sampler
  int64_t epilogue_states() const { return epilogue_states_; }  // states the epilogue sampled so far
  double epilogue_ms() const { return epilogue_ms_; }             // and the milliseconds inside its calls
  OrtOutput block_device_logits(const std::vector<int64_t>& states, int64_t n);
  EpilogueResult sample_state(const OrtOutput& logits, int64_t row, const std::vector<int64_t>& state, int64_t step,
                              const Sampling& sampling, uint32_t block);

 private:
  // The target's inputs for ids [N, S] after the cache: host tensors (borrowing ids, bias, pos and the host
  // cache) and, with the device cache once filled, every layer's past_k_<l> / past_v_<l> bound where they are.
  struct Feeds {
    std::vector<std::string> names;     // of `host`
    std::vector<InputTensor> host;
    std::vector<BorrowedInput> device;
  };
  Feeds feeds(const std::vector<int64_t>& ids, int64_t n, int64_t s, const std::vector<uint8_t>& bias,
              const std::vector<int64_t>& pos) const;
  std::vector<int64_t> positions(int64_t s) const;   // cached_ .. cached_ + s - 1
  std::vector<OrtOutput> run(const std::vector<std::string>& outputs, const std::vector<int64_t>& ids, int64_t n,
                             int64_t s, const std::vector<uint8_t>& bias);
  void check_states(const std::vector<int64_t>& states, int64_t n) const;
  // every layer's past_k_<l> / past_v_<l> where the cache is: borrowed device values, or host tensors (the host
  // cache; empty while the device cache is)
  void add_past(std::vector<std::string>& names, std::vector<InputTensor>& host,
                std::vector<BorrowedInput>& device) const;
  std::vector<uint8_t> step_bias() const;
  void check_ids(const std::vector<int64_t>& ids, const char* what) const;
  void check_room(int64_t n) const;
  // run one state ids [S] and append its tokens' K/V to the cache (host memory or the device)
  void extend(const std::vector<int64_t>& ids, int64_t s, const std::vector<uint8_t>& bias);
  // the first `keep` of s tokens of host new_k / new_v [L, 1, Hkv, S, D] into the host cache
  void append_host_kv(const OrtOutput& new_k, const OrtOutput& new_v, int64_t s, int64_t keep);
  // the same into the device cache: kv_append per layer, fed host copies of the layer's kept tokens
  void append_device_kv_from_host(const OrtOutput& new_k, const OrtOutput& new_v, int64_t s, int64_t keep);
  // kv_append per layer over the device cache (keep new tokens), add_new(layer, names, host, device) binding the
  // layer's new_k / new_v inputs
  using NewKV = std::function<void(int64_t, std::vector<std::string>&, std::vector<InputTensor>&,
                                   std::vector<BorrowedInput>&)>;
  void append_device_kv(int64_t keep, const NewKV& add_new);
  std::vector<uint8_t> block_causal_bias(int64_t s) const;   // [S, C + S]: the cache, the S tokens block-causal
  // the fused pass: [store, state] run, store's K/V appended; the logits kept at `logits_place`
  OrtOutput fused_pass(const std::vector<int64_t>& store, const std::vector<int64_t>& state,
                       const MemoryPlace& logits_place);

  std::shared_ptr<const TargetGraphs> graphs_;
  // the graphs' facts every pass reads, at hand (the graphs never change)
  const ModelFacts& cfg_;
  int64_t b_, max_context_, max_nodes_;
  size_t elem_;
  ONNXTensorElementDataType kv_type_;
  std::vector<OrtOutput> device_k_, device_v_;   // the device cache, [Hkv, C, D] per layer; empty while empty
  int64_t epilogue_states_ = 0;
  double epilogue_ms_ = 0;
  std::vector<std::vector<uint8_t>> k_, v_;  // the host cache, [Hkv, C, D] per layer in the model dtype
  int64_t cached_ = 0;
};

}  // namespace spot
