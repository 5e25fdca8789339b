#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "bounds.h"
#include "errors.h"
#include "paths.h"
#include "schema.h"
#include "sha256.h"

namespace spot {
namespace {

const char* kManifest = "manifest.json";
const char* kFormat = "spot-exported-model";
// 2: per-layer cache inputs past_k_<l> / past_v_<l> [Hkv, C, D], the prefix read once per pass; kv_append appends
// one layer (spot.folder.manifest.FORMAT_VERSION). A format 1 folder is converted by `spot upgrade-export`.
constexpr int64_t kFormatVersion = 2;
constexpr uint64_t kQuickFullLimit = 64ull * 1024 * 1024;   // spot.folder.manifest.QUICK_FULL_LIMIT
const char* kChangedHint = "the folder was modified or copied incompletely: copy it again or re-export it with "
                           "spot-export";
const std::vector<std::string> kInputs = {"input_ids", "position_ids", "attn_bias"};   // + the per-layer cache
const std::vector<std::string> kOutputs = {"logits", "new_k", "new_v"};
// the sampling epilogue's (spot.folder.epilogue.INPUTS, OUTPUTS; the outputs in the order sample_state reads them)
const std::vector<std::string> kEpilogueInputs = {"logits", "node_steps", "seed", "block", "temperature", "top_k",
                                                  "exclude_token", "first_position"};
const std::vector<std::string> kEpilogueOutputs = {"token", "confidence", "future_tokens", "future_conf",
                                                   "top_logprobs", "future_runner_up", "future_gap"};

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void verify_files(const std::string& folder, const Json& files, spot_verify level) {
  for (const auto& kv : files.members()) {
    const std::string& name = kv.first;
    const Json& rec = kv.second;
    // the drafter pair is verified by drafter.json's onnx_sha256 when it loads (manifest.DRAFTER_FILES): train-drafter
    // and calibrate-drafter replace it in place; manifests written before still list it
    if (name == "drafter.onnx" || name == "drafter.json") continue;
    // (names and records were checked when the manifest was read: files of the folder itself, kManifestFields)
    std::string path = join(folder, name);
    uint64_t size = 0;
    if (!is_file(path, &size))
      fail(SPOT_ERR_NOT_FOUND, name + " is missing from the exported folder " + folder + " (" + kChangedHint + ")");
    if (level == SPOT_VERIFY_NONE) continue;
    uint64_t want = static_cast<uint64_t>(rec.at("bytes").integer());
    if (size != want)
      fail(SPOT_ERR_CORRUPT, name + " in " + folder + " changed since export: " + std::to_string(size) +
                                 " bytes, manifest says " + std::to_string(want) + " (" + kChangedHint + ")");
    bool full = level == SPOT_VERIFY_FULL || size <= kQuickFullLimit;
    std::string got = full ? sha256_file(path) : sample_sha256_file(path);
    if (got != rec.at(full ? "sha256" : "sample_sha256").str())
      fail(SPOT_ERR_CORRUPT, name + " in " + folder + " changed since export: its " +
                                 (full ? "sha256" : "sampled sha256") + " differs from the manifest (" +
                                 kChangedHint + ")");
  }
}

// -- manifest.json's fields, as spot.folder.manifest.MANIFEST and spot.config.MODEL_SECTION check them ----------
// A name of a file in the exported folder itself (manifest.folder_file_name): never a path that leaves it.
bool folder_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

const schema::Field& manifest_fields() {
  using namespace schema;
  static const Field kField = [] {
    const Field token_id = integer(0, kMaxVocab - 1);
    const Field stop_ids = list_of(token_id, kMaxStopIds);
    const Field model = record({{"vocab_size", integer(1, kMaxVocab)},
                                {"hidden_size", integer(1, kMaxHidden)},
                                {"intermediate_size", integer(1, kMaxIntermediate)},
                                {"num_hidden_layers", integer(1, kMaxLayers)},
                                {"num_attention_heads", integer(1, kMaxHeads)},
                                {"num_key_value_heads", integer(1, kMaxHeads)},
                                {"head_dim", integer(1, kMaxHeadDim)},
                                {"max_position_embeddings", integer(1, kMaxPositions)},
                                {"rms_norm_eps", number(0, HUGE_VAL, true)},
                                {"rope_theta", number(0, HUGE_VAL, true)},
                                {"block_size", integer(1, kMaxBlockSize)},
                                {"mask_token_id", token_id},
                                {"stop_ids", stop_ids},
                                {"tie_word_embeddings", boolean()},
                                {"torch_dtype", text()},
                                {"model_type", text({"sdar"})}},
                               {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"},
                               "an object of model facts", true);
    const Field file_name = satisfies(folder_file_name, "the name of a file in the exported folder itself");
    const Field file_record = record({{"bytes", integer(0, kMaxFileBytes)}, {"sha256", sha256()},
                                      {"sample_sha256", sha256()}},
                                     {"bytes", "sha256", "sample_sha256"},
                                     "{\"bytes\": N, \"sha256\": ..., \"sample_sha256\": ...}");
    const Field graph = record({{"file", file_name}}, {"file"}, "an object with a \"file\" name");
    const Field shapes = map_of(text(), list_of(integer(0, kMaxPositions), kMaxDims), "an object of input: [dims]");
    const Field profile = record({{"min", shapes}, {"opt", shapes}, {"max", shapes}}, {"min", "opt", "max"},
                                 "{\"min\"|\"opt\"|\"max\": {input: [dims]}}");
    const Field target =
        record({{"file", file_name}, {"tensorrt_profile", nullable(profile)}}, {"file"}, graph.expected);
    const Field epilogue = record({{"file", file_name}, {"future_steps", integer(1, kMaxBlockSize)},
                                   {"positions_per_call", nullable(integer(1, kMaxBlockSize))}},
                                  {"file", "future_steps"}, "an object with a \"file\" name and \"future_steps\"");
    return record({{"model", model},
                   {"dtype", text({"fp32", "fp16"})},
                   {"block_size", integer(1, kMaxBlockSize)},
                   {"max_nodes", integer(1, kMaxNodes)},
                   {"max_context", integer(1, kMaxPositions)},
                   {"mask_token_id", token_id},
                   {"stop_ids", stop_ids},
                   {"graphs", record({{"target", target}, {"epilogue", nullable(epilogue)}}, {"target"}, "an object",
                                     false, graph)},
                   {"files", map_of(file_name, file_record)},
                   {"ort_session_config", nullable(map_of(text(), text()))}},
                  {"model", "dtype", "block_size", "max_nodes", "max_context", "graphs", "files"}, "an object");
  }();
  return kField;
}

int64_t integer_or(const Json& obj, const char* key, int64_t fallback) {
  const Json* v = obj.find(key);
  return v ? v->integer() : fallback;
}

// manifest.check_manifest_rules (and config.check_model_rules): the rules across fields, on a manifest whose fields
// manifest_fields() took
void check_manifest_rules(const Json& m) {
  using schema::rule;
  const Json& model = m.at("model");
  const int64_t heads = model.at("num_attention_heads").integer(), kv = model.at("num_key_value_heads").integer();
  const int64_t vocab = model.at("vocab_size").integer(), head_dim = model.at("head_dim").integer();
  const int64_t mask = integer_or(model, "mask_token_id", 151669);
  rule(heads % kv == 0, "model.num_key_value_heads", std::to_string(kv),
       "a divisor of num_attention_heads (" + std::to_string(heads) + ")");
  rule(head_dim % 2 == 0, "model.head_dim", std::to_string(head_dim), "an even integer (rotate-half RoPE)");
  rule(mask < vocab, "model.mask_token_id", std::to_string(mask),
       "an id inside the vocabulary, 0.." + std::to_string(vocab - 1));
  const int64_t block = m.at("block_size").integer(), context = m.at("max_context").integer();
  const int64_t positions = model.at("max_position_embeddings").integer();
  rule(block <= context && context <= positions, "max_context", std::to_string(context),
       "an integer in " + std::to_string(block) + ".." + std::to_string(positions) +
           " (block_size..model.max_position_embeddings)");
  const Json& graphs = m.at("graphs");
  if (const Json* epi = graphs.find("epilogue"); epi && !epi->is_null()) {
    const int64_t steps = epi->at("future_steps").integer();
    rule(steps <= block, "graphs.epilogue.future_steps", std::to_string(steps),
         "an integer in 1.." + std::to_string(block) + " (the block size)");
    if (const Json* p = epi->find("positions_per_call"); p && !p->is_null())
      rule(p->integer() <= block && block % p->integer() == 0, "graphs.epilogue.positions_per_call",
           std::to_string(p->integer()), "a divisor of the block size " + std::to_string(block));
  }
  for (const auto& [name, graph] : graphs.members()) {
    if (name == "drafter" || graph.is_null()) continue;   // (drafter.json hashes the drafter's graph)
    const std::string& file = graph.at("file").str();
    rule(m.at("files").has(file), "graphs." + name + ".file", "'" + file + "'",
         "a file the files record lists (no hash vouches for it otherwise)");
  }
}

ModelFacts parse_model(const Json& m) {   // a "model" section manifest_fields() and check_manifest_rules took
  ModelFacts c;
  c.vocab_size = m.at("vocab_size").integer();
  c.hidden_size = m.at("hidden_size").integer();
  c.intermediate_size = m.at("intermediate_size").integer();
  c.num_hidden_layers = m.at("num_hidden_layers").integer();
  c.num_attention_heads = m.at("num_attention_heads").integer();
  c.num_key_value_heads = m.at("num_key_value_heads").integer();
  c.head_dim = m.at("head_dim").integer();
  c.max_position_embeddings = m.at("max_position_embeddings").integer();
  c.block_size = integer_or(m, "block_size", 4);
  c.mask_token_id = integer_or(m, "mask_token_id", 151669);
  if (m.has("stop_ids")) {
    for (const Json& s : m.at("stop_ids").items()) c.stop_ids.push_back(s.integer());
  } else {
    c.stop_ids = {151645, 151643};
  }
  return c;
}

uint16_t fp16_neg_inf() { return 0xFC00; }

// {"input_ids": [1, 4], ...} -> "input_ids:1x4,..." (ORT's trt_profile_*_shapes format), in the manifest's order
std::string trt_shape_option(const Json& shapes) {
  std::string out;
  for (const auto& [name, dims] : shapes.members()) {
    out += (out.empty() ? "" : ",") + name + ":";
    const auto& items = dims.items();
    for (size_t i = 0; i < items.size(); ++i) out += (i ? "x" : "") + std::to_string(items[i].integer());
  }
  return out;
}

}  // namespace

ExportedFolder load_exported_folder(const std::string& folder, spot_verify verify) {
  if (!is_dir(folder)) fail(SPOT_ERR_NOT_FOUND, "exported model folder " + folder + " does not exist");
  std::string mpath = join(folder, kManifest);
  if (!is_file(mpath))
    fail(SPOT_ERR_NOT_FOUND, folder + " is not an exported spot model folder (no manifest.json): export a "
                                      "checkpoint with `spot export`");
  ExportedFolder ef;
  ef.folder = folder;
  try {
    ef.manifest = Json::parse(read_text_file(mpath));
  } catch (const SpotException& e) {
    fail(SPOT_ERR_CORRUPT, mpath + " is not valid JSON (" + e.what() + "): re-export the model");
  }
  const Json& m = ef.manifest;
  const Json* fmt = m.find("format");
  if (fmt == nullptr || !fmt->is_string() || fmt->str() != kFormat)
    fail(SPOT_ERR_CORRUPT, mpath + " is not a spot export manifest (format is not '" + kFormat + "')");
  const Json* ver = m.find("format_version");
  if (ver != nullptr && ver->is_integer() && ver->integer() == 1)
    fail(SPOT_ERR_INCOMPATIBLE, mpath + " has format_version 1, this host reads 2 (its target graph takes each "
                                        "layer's cache as its own input): run `spot upgrade-export " + folder +
                                        "` (seconds: the graph is rewritten, the weights stay)");
  if (ver == nullptr || !ver->is_integer() || ver->integer() != kFormatVersion)
    fail(SPOT_ERR_INCOMPATIBLE, mpath + " has a format_version this host does not read (expected 2): re-export "
                                        "the model with this version of spot-export");
  const std::string remedy = " (re-export the model with spot-export)";
  for (const char* key : {"model", "dtype", "block_size", "max_nodes", "max_context", "graphs", "files"})
    if (!m.has(key)) fail(SPOT_ERR_CORRUPT, mpath + " lacks field '" + key + "'" + remedy);
  try {   // every field the host reads, its type and range, before anything is sized by one
    manifest_fields().check(m);
    check_manifest_rules(m);
  } catch (const schema::Mismatch& e) {
    fail(SPOT_ERR_CORRUPT, e.message(mpath) + remedy);
  }
  ef.config = parse_model(m.at("model"));
  ef.dtype = m.at("dtype").str();
  ef.block_size = m.at("block_size").integer();
  ef.max_nodes = m.at("max_nodes").integer();
  ef.max_context = m.at("max_context").integer();
  const Json& graphs = m.at("graphs");
  ef.target_graph = join(folder, graphs.at("target").at("file").str());
  if (const Json* epi = graphs.find("epilogue"); epi && !epi->is_null()) {
    ef.epilogue_graph = join(folder, epi->at("file").str());
    ef.epilogue_steps = epi->at("future_steps").integer();
    if (const Json* p = epi->find("positions_per_call"); p && !p->is_null()) ef.epilogue_positions = p->integer();
  }
  // the decoding defaults copied from the model config (spot.folder.manifest.check_manifest_fields): the
  // manifest is not hashed, so an edit is refused rather than half used
  bool same = ef.block_size == ef.config.block_size;
  if (const Json* mask = m.find("mask_token_id")) same = same && mask->integer() == ef.config.mask_token_id;
  if (const Json* stops = m.find("stop_ids")) {
    std::vector<int64_t> ids;
    for (const Json& t : stops->items()) ids.push_back(t.integer());
    same = same && ids == ef.config.stop_ids;
  }
  if (!same)
    fail(SPOT_ERR_CORRUPT, mpath + ": block_size / mask_token_id / stop_ids differ from model.* (edited?)" + remedy);
  // spot-export and spot upgrade-export write it into every format 2 folder (manifest.load_manifest)
  const Json* kv = graphs.find("kv_append");
  if (!kv || kv->is_null())
    fail(SPOT_ERR_INCOMPATIBLE, mpath + " lists no kv_append graph, expected one in every format " +
                                    std::to_string(kFormatVersion) + " folder: run `spot upgrade-export " + folder +
                                    "` (seconds: the graph is written, the weights stay)");
  ef.kv_append_graph = join(folder, kv->at("file").str());
  if (const Json* sc = m.find("ort_session_config"); sc && !sc->is_null())
    for (const auto& [key, value] : sc->members()) ef.ort_session_config.emplace_back(key, value.str());
  verify_files(folder, m.at("files"), verify);
  return ef;
}

namespace {

// threads as the Python runtime sets them: intra-op threads and one inter-op thread, or ORT's defaults at 0
SessionConfig session_config(int threads, Device device) {
  SessionConfig sc;
  sc.intra_threads = threads;
  sc.single_inter_thread = threads > 0;
  sc.device = device;
  return sc;
}

// spot.folder.manifest.check_graph_io: a graph's declared inputs and outputs against what the manifest's dtype and
// model section (and the epilogue's future_steps) imply; -1: a dynamic dim. An edited num_hidden_layers,
// num_key_value_heads, head_dim, vocab_size or dtype surfaced as ONNX Runtime's error on the first pass.
struct Expected {
  std::string name;
  ONNXTensorElementDataType type;
  std::vector<int64_t> dims;
};

std::string type_name(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    default: return "type " + std::to_string(static_cast<int>(t));
  }
}

std::string shape_text(ONNXTensorElementDataType t, const std::vector<int64_t>& dims) {
  std::string out = type_name(t) + " [";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + (dims[i] < 0 ? "?" : std::to_string(dims[i]));
  return out + "]";
}

void check_graph_io(const ExportedFolder& f, const std::string& graph, const OrtSessionHandle& session,
                    const std::vector<Expected>& expected) {
  for (const Expected& want : expected) {
    const OrtSessionHandle::Declared got = session.declared(want.name);
    bool fits = got.found && got.type == want.type && got.dims.size() == want.dims.size();
    for (size_t i = 0; fits && i < want.dims.size(); ++i)
      fits = want.dims[i] < 0 || got.dims[i] < 0 || got.dims[i] == want.dims[i];
    if (!fits)
      fail(SPOT_ERR_CORRUPT, join(f.folder, kManifest) + " contradicts " + graph + ": " + want.name + " is " +
                                 (got.found ? shape_text(got.type, got.dims) : std::string("none")) +
                                 " in the graph, the manifest implies " + shape_text(want.type, want.dims) +
                                 " (from its dtype, model.num_hidden_layers, num_key_value_heads, head_dim, "
                                 "vocab_size and the epilogue's future_steps: edited?): restore manifest.json "
                                 "from the export, or re-export the model with spot-export");
  }
}

}  // namespace

std::string trt_cache_dir(const ExportedFolder& f) {
  const char* env = std::getenv("SPOT_CACHE");
  const char* home = std::getenv("HOME");
  std::string base = env && *env ? env : join(join(home && *home ? home : ".", ".cache"), "spot");
  return join(join(base, "trt"), sha256_file(join(f.folder, kManifest)).substr(0, 16));
}

TargetGraphs::TargetGraphs(const ExportedFolder& f, int threads, Device device, Placement sampler,
                           Placement kv_cache)
    : cfg(f.config),
      b(f.block_size),
      max_context(std::min(f.max_context, f.config.max_position_embeddings)),
      max_nodes(f.max_nodes),
      elem(f.dtype == "fp16" ? 2 : 4),
      kv_type(f.dtype == "fp16" ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT),
      host_place(std::make_unique<MemoryPlace>(Device::kCpu)) {
  SessionConfig sc = session_config(threads, device);
  sc.config_entries = f.ort_session_config;
  if (device == Device::kTensorRT) {
    // the shape ranges spot-export recorded (spot.engines.ort_sessions.recorded_trt_profile)
    const Json* prof = f.manifest.at("graphs").at("target").find("tensorrt_profile");
    if (prof == nullptr || prof->is_null())
      fail(SPOT_ERR_INCOMPATIBLE, f.folder + " was exported without a TensorRT shape profile, which device trt needs "
                                             "(without one, ONNX Runtime's TensorRT provider builds its engine again "
                                             "whenever the KV cache outgrows the shapes it has seen): run `spot "
                                             "upgrade-export " + f.folder + "`, or use device cuda");
    try {
      sc.trt_profile_min = trt_shape_option(prof->at("min"));
      sc.trt_profile_opt = trt_shape_option(prof->at("opt"));
      sc.trt_profile_max = trt_shape_option(prof->at("max"));
      const auto& tokens = prof->at("max").at("position_ids").items();
      if (tokens.size() != 1) fail(SPOT_ERR_CORRUPT, "position_ids must have one dimension");
      prefill_chunk = tokens[0].integer();   // the profile's longest pass: two blocks (the fused store pass)
    } catch (const SpotException& e) {
      fail(SPOT_ERR_CORRUPT, f.folder + "/manifest.json: tensorrt_profile is malformed (" + e.what() +
                                 "): run `spot upgrade-export " + f.folder + "`");
    }
    sc.trt_cache_dir = trt_cache_dir(f);
    sc.trt_fp16 = f.dtype == "fp16";
  }
  session = std::make_unique<OrtSessionHandle>(f.target_graph, sc);
  for (int64_t layer = 0; layer < cfg.num_hidden_layers; ++layer) {   // spot.folder.manifest.past_input_names
    past_names.push_back("past_k_" + std::to_string(layer));
    past_names.push_back("past_v_" + std::to_string(layer));
  }
  // the per-layer cache inputs are check_graph_io's below: one missing contradicts model.num_hidden_layers
  for (const auto& want : kInputs)
    if (std::find(session->input_names().begin(), session->input_names().end(), want) ==
        session->input_names().end())
      fail(SPOT_ERR_INCOMPATIBLE, f.target_graph + " has no input '" + want + "': not a spot target graph");
  for (const auto& want : kOutputs)
    if (std::find(session->output_names().begin(), session->output_names().end(), want) ==
        session->output_names().end())
      fail(SPOT_ERR_INCOMPATIBLE, f.target_graph + " has no output '" + want + "': not a spot target graph");
  const int64_t L = cfg.num_hidden_layers, H = cfg.num_key_value_heads, D = cfg.head_dim;
  const ONNXTensorElementDataType i64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, f32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  // in spot.folder.manifest.io_contract's order, so that both hosts name the same first contradiction
  std::vector<Expected> expected = {
      {"input_ids", i64, {-1, -1}}, {"position_ids", i64, {-1}}, {"attn_bias", kv_type, {-1, -1}}};
  for (const auto& name : past_names) expected.push_back({name, kv_type, {H, -1, D}});
  expected.insert(expected.end(), {{"logits", f32, {-1, -1, cfg.vocab_size}}, {"new_k", kv_type, {L, -1, H, -1, D}},
                                   {"new_v", kv_type, {L, -1, H, -1, D}}});
  check_graph_io(f, f.target_graph, *session, expected);
  open_epilogue(f, threads, device, sampler);
  open_kv_append(f, threads, device, kv_cache);
}

TargetEngine::TargetEngine(std::shared_ptr<const TargetGraphs> graphs)
    : graphs_(std::move(graphs)),
      cfg_(graphs_->cfg),
      b_(graphs_->b),
      max_context_(graphs_->max_context),
      max_nodes_(graphs_->max_nodes),
      elem_(graphs_->elem),
      kv_type_(graphs_->kv_type) {
  k_.assign(static_cast<size_t>(cfg_.num_hidden_layers), {});
  v_.assign(static_cast<size_t>(cfg_.num_hidden_layers), {});
}

TargetEngine::TargetEngine(const ExportedFolder& f, int threads, Device device, Placement sampler,
                           Placement kv_cache)
    : TargetEngine(std::make_shared<const TargetGraphs>(f, threads, device, sampler, kv_cache)) {}

namespace {

// spot.engines.ort_sessions.on_device: device when asked, or on auto on a GPU provider when the graph is there
bool on_device(Placement choice, Device device, bool available) {
  return choice == Placement::kDevice || (choice == Placement::kAuto && device != Device::kCpu && available);
}

}  // namespace

void TargetGraphs::make_place(Device device) {
  if (!place) place = std::make_unique<MemoryPlace>(device);
}

void TargetGraphs::open_kv_append(const ExportedFolder& f, int threads, Device device, Placement kv_cache) {
  if (!on_device(kv_cache, device, true)) return;   // every folder has kv_append (load_exported_folder)
  // a Concat with a new shape at every stored block: the CUDA provider also under TensorRT (as in Python)
  SessionConfig sc = session_config(threads, device == Device::kTensorRT ? Device::kCuda : device);
  sc.cuda_exact_arena = true;   // the cache grows by one block per store: no power-of-two slack
  kv_append = std::make_unique<OrtSessionHandle>(f.kv_append_graph, sc);
  for (const char* want : {"past_k", "past_v", "new_k", "new_v"})
    if (std::find(kv_append->input_names().begin(), kv_append->input_names().end(), want) ==
        kv_append->input_names().end())
      fail(SPOT_ERR_INCOMPATIBLE, f.kv_append_graph + " has no input '" + want + "': not a spot kv_append graph");
  const int64_t H = cfg.num_key_value_heads, D = cfg.head_dim;   // one layer's append (format 2)
  check_graph_io(f, f.kv_append_graph, *kv_append,
                 {{"past_k", kv_type, {H, -1, D}}, {"past_v", kv_type, {H, -1, D}},
                  {"new_k", kv_type, {H, -1, D}}, {"new_v", kv_type, {H, -1, D}},
                  {"k", kv_type, {H, -1, D}}, {"v", kv_type, {H, -1, D}}});
  make_place(device);
}

void TargetGraphs::open_epilogue(const ExportedFolder& f, int threads, Device device, Placement sampler) {
  const bool has = !f.epilogue_graph.empty();
  if (!on_device(sampler, device, has)) return;
  if (!has)
    fail(SPOT_ERR_INCOMPATIBLE, f.folder + " has no sampling epilogue graph (needed by the device sampler): "
                                           "add one with `spot upgrade-export " + f.folder + "` (--epilogue-steps "
                                           "N, N > 0; the weights stay), or use the host sampler");
  if (f.epilogue_steps < 1 || f.epilogue_steps > f.config.block_size)   // spot-export's bound (1..B)
    fail(SPOT_ERR_CORRUPT, join(f.folder, kManifest) + ": the epilogue's future_steps is " +
                               std::to_string(f.epilogue_steps) + ", expected 1.." +
                               std::to_string(f.config.block_size) + " (the block size)");
  // TensorRT has neither float64 nor uint32 arithmetic: the epilogue runs on the CUDA provider (as in Python)
  SessionConfig sc = session_config(threads, device == Device::kTensorRT ? Device::kCuda : device);
  epilogue = std::make_unique<OrtSessionHandle>(f.epilogue_graph, sc);
  // ort_sessions.check_epilogue_io: every input and output this host binds; an epilogue exported before runner-ups
  // (future_runner_up, future_gap) or position runs (first_position) lacks some, and `spot upgrade-export` rewrites it
  std::vector<std::string> missing;
  auto lacks = [&](const std::vector<std::string>& have, const std::vector<std::string>& want) {
    for (const std::string& n : want)
      if (std::find(have.begin(), have.end(), n) == have.end()) missing.push_back(n);
  };
  lacks(epilogue->input_names(), kEpilogueInputs);
  lacks(epilogue->output_names(), kEpilogueOutputs);
  if (!missing.empty())
    fail(SPOT_ERR_INCOMPATIBLE, f.epilogue_graph + " is an older sampling epilogue: got no " + listed(missing) +
                                    ", expected inputs " + listed(kEpilogueInputs) + " and outputs " +
                                    listed(kEpilogueOutputs) + " (run `spot upgrade-export " + f.folder +
                                    "`: seconds, the weights stay; or use the host sampler)");
  check_graph_io(f, f.epilogue_graph, *epilogue,
                 {{"logits", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, {-1, -1, cfg.vocab_size}},
                  {"future_tokens", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {-1, f.epilogue_steps, -1}}});
  epilogue_steps = f.epilogue_steps;
  epilogue_graph_path = f.epilogue_graph;
  // positions per call: the manifest's (ort_sessions.epilogue_positions)
  if (f.epilogue_positions == 0)
    fail(SPOT_ERR_INCOMPATIBLE, join(f.folder, kManifest) + " records no positions_per_call for its epilogue (an "
                                                            "epilogue exported before position runs): run `spot "
                                                            "upgrade-export " + f.folder + "`");
  epilogue_positions = f.epilogue_positions;
  if (epilogue_positions < 1 || epilogue_positions > b || b % epilogue_positions)
    fail(SPOT_ERR_CORRUPT, join(f.folder, kManifest) + ": the epilogue's positions_per_call must divide the block "
                                                       "size " + std::to_string(b) + ", got " +
                                                       std::to_string(epilogue_positions));
  make_place(device);
}

void TargetEngine::check_ids(const std::vector<int64_t>& ids, const char* what) const {
  for (int64_t t : ids)
    if (t < 0 || t >= cfg_.vocab_size)
      fail(SPOT_ERR_INVALID_ARGUMENT, std::string(what) + ": token id " + std::to_string(t) +
                                          " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
}

void TargetEngine::check_room(int64_t n) const {
  if (cached_ + n > max_context_)
    fail(SPOT_ERR_INVALID_ARGUMENT, "context of " + std::to_string(cached_ + n) +
                                        " tokens exceeds the engine's limit of " + std::to_string(max_context_));
}

std::vector<int64_t> TargetEngine::positions(int64_t s) const {
  std::vector<int64_t> pos(static_cast<size_t>(s));
  for (int64_t i = 0; i < s; ++i) pos[i] = cached_ + i;
  return pos;
}

std::vector<OrtOutput> TargetEngine::run(const std::vector<std::string>& outputs, const std::vector<int64_t>& ids,
                                         int64_t n, int64_t s, const std::vector<uint8_t>& bias) {
  const std::vector<int64_t> pos = positions(s);
  Feeds f = feeds(ids, n, s, bias, pos);
  return graphs_->session->run(f.names, f.host, outputs, f.device);
}

TargetEngine::Feeds TargetEngine::feeds(const std::vector<int64_t>& ids, int64_t n, int64_t s,
                                        const std::vector<uint8_t>& bias, const std::vector<int64_t>& pos) const {
  Feeds f;
  f.names = {kInputs[0], kInputs[1], kInputs[2]};
  f.host = {
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {n, s}, ids.data(), ids.size() * sizeof(int64_t)},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {s}, pos.data(), pos.size() * sizeof(int64_t)},
      {kv_type_, {s, cached_ + s}, bias.data(), bias.size()},
  };
  add_past(f.names, f.host, f.device);
  return f;
}

void TargetEngine::add_past(std::vector<std::string>& names, std::vector<InputTensor>& host,
                            std::vector<BorrowedInput>& device) const {
  const int64_t H = cfg_.num_key_value_heads, D = cfg_.head_dim;
  for (size_t layer = 0; layer < k_.size(); ++layer) {
    const std::string &k = graphs_->past_names[2 * layer], &v = graphs_->past_names[2 * layer + 1];
    if (!device_k_.empty()) {
      device.push_back({k, device_k_[layer].value()});
      device.push_back({v, device_v_[layer].value()});
    } else {
      names.insert(names.end(), {k, v});
      host.push_back({kv_type_, {H, cached_, D}, k_[layer].data(), k_[layer].size()});
      host.push_back({kv_type_, {H, cached_, D}, v_[layer].data(), v_[layer].size()});
    }
  }
}

std::vector<uint8_t> TargetEngine::step_bias() const {
  return std::vector<uint8_t>(static_cast<size_t>(b_ * (cached_ + b_)) * elem_, 0);   // zeros: attend everywhere
}

void TargetEngine::extend(const std::vector<int64_t>& ids, int64_t s, const std::vector<uint8_t>& bias) {
  const int64_t L = cfg_.num_hidden_layers, H = cfg_.num_key_value_heads, D = cfg_.head_dim;
  if (!graphs_->kv_append) {
    std::vector<OrtOutput> out = run({"new_k", "new_v"}, ids, 1, s, bias);
    append_host_kv(out[0], out[1], s, s);
    return;
  }
  const std::vector<int64_t> pos = positions(s);
  Feeds f = feeds(ids, 1, s, bias, pos);
  std::vector<OrtOutput> fresh =
      graphs_->session->run_keeping(f.names, f.host, {"new_k", "new_v"}, *graphs_->place, f.device);
  const std::vector<int64_t> fresh_shape = {L, 1, H, s, D};
  if (fresh[0].shape() != fresh_shape || fresh[1].shape() != fresh_shape)
    fail(SPOT_ERR_RUNTIME, "the target graph returned new_k/new_v of an unexpected shape");
  // each layer's new K/V read in place (a view of the pass's output)
  const size_t layer_elems = static_cast<size_t>(H * s * D);
  std::vector<OrtOutput> views;
  append_device_kv(s, [&](int64_t layer, std::vector<std::string>&, std::vector<InputTensor>&,
                          std::vector<BorrowedInput>& device) {
    views.clear();
    views.push_back(fresh[0].view(layer * layer_elems, {H, s, D}));
    views.push_back(fresh[1].view(layer * layer_elems, {H, s, D}));
    device.push_back({"new_k", views[0].value()});
    device.push_back({"new_v", views[1].value()});
  });
}

void TargetEngine::append_device_kv(int64_t keep, const NewKV& add_new) {
  // kv_append.onnx per layer: Concat(past, new) on the device; the empty cache is a zero-size host tensor. A layer's
  // old cache is released once its longer one exists: the transient is one layer's cache, not a second cache.
  const int64_t L = cfg_.num_hidden_layers, H = cfg_.num_key_value_heads, D = cfg_.head_dim;
  const std::vector<int64_t> want = {H, cached_ + keep, D};
  const std::vector<uint8_t> none;
  const bool first = device_k_.empty();     // the first stored tokens: every layer's cache starts empty
  for (int64_t layer = 0; layer < L; ++layer) {
    std::vector<std::string> names;
    std::vector<InputTensor> host;
    std::vector<BorrowedInput> device;
    add_new(layer, names, host, device);
    if (first) {
      names.insert(names.end(), {"past_k", "past_v"});
      host.push_back({kv_type_, {H, 0, D}, none.data(), 0});
      host.push_back({kv_type_, {H, 0, D}, none.data(), 0});
    } else {
      device.push_back({"past_k", device_k_[layer].value()});
      device.push_back({"past_v", device_v_[layer].value()});
    }
    std::vector<OrtOutput> kv = graphs_->kv_append->run_keeping(names, host, {"k", "v"}, *graphs_->place, device);
    if (kv[0].shape() != want || kv[1].shape() != want)
      fail(SPOT_ERR_INCOMPATIBLE, "kv_append.onnx returned a cache of an unexpected shape: re-export the folder");
    if (first) {
      device_k_.push_back(std::move(kv[0]));
      device_v_.push_back(std::move(kv[1]));
    } else {
      device_k_[layer] = std::move(kv[0]);
      device_v_[layer] = std::move(kv[1]);
    }
  }
}

namespace {

// The first `keep` of s tokens of one layer's host new K or V [Hkv, S, D] (elem bytes each), contiguous.
void kept_tokens(const uint8_t* layer, int64_t H, int64_t s, int64_t keep, size_t row_bytes, std::vector<uint8_t>& out) {
  out.resize(static_cast<size_t>(H * keep) * row_bytes);
  for (int64_t h = 0; h < H; ++h)
    std::memcpy(out.data() + h * keep * row_bytes, layer + h * s * row_bytes, static_cast<size_t>(keep) * row_bytes);
}

}  // namespace

void TargetEngine::append_device_kv_from_host(const OrtOutput& new_k, const OrtOutput& new_v, int64_t s,
                                              int64_t keep) {
  // kv_append reads one contiguous [Hkv, S, D] input per K / V, and the first B of a fused pass's 2B tokens are not
  // one: the pass's new K/V came to the host (2 x L x Hkv x 2B x D values, ~1 MB for SDAR-8B at B = 4, against a
  // target pass saved) and each layer's kept tokens go back as kv_append's inputs
  const int64_t L = cfg_.num_hidden_layers, H = cfg_.num_key_value_heads, D = cfg_.head_dim;
  const std::vector<int64_t> shape = {L, 1, H, s, D};
  if (new_k.shape() != shape || new_v.shape() != shape)
    fail(SPOT_ERR_RUNTIME, "the target graph returned new_k/new_v of an unexpected shape");
  const size_t row = static_cast<size_t>(D) * elem_, layer_bytes = static_cast<size_t>(H * s) * row;
  std::vector<uint8_t> k, v;
  append_device_kv(keep, [&](int64_t layer, std::vector<std::string>& names, std::vector<InputTensor>& host,
                             std::vector<BorrowedInput>&) {
    kept_tokens(static_cast<const uint8_t*>(new_k.data()) + layer * layer_bytes, H, s, keep, row, k);
    kept_tokens(static_cast<const uint8_t*>(new_v.data()) + layer * layer_bytes, H, s, keep, row, v);
    names.insert(names.end(), {"new_k", "new_v"});
    host.push_back({kv_type_, {H, keep, D}, k.data(), k.size()});
    host.push_back({kv_type_, {H, keep, D}, v.data(), v.size()});
  });
}

void TargetEngine::append_host_kv(const OrtOutput& new_k, const OrtOutput& new_v, int64_t s, int64_t keep) {
  // new_k / new_v [L, 1, Hkv, S, D] -> each layer's cache [Hkv, C + keep, D], one layer's longer cache at a time
  const int64_t L = cfg_.num_hidden_layers, H = cfg_.num_key_value_heads, D = cfg_.head_dim;
  std::vector<int64_t> want = {L, 1, H, s, D};
  if (new_k.shape() != want || new_v.shape() != want)
    fail(SPOT_ERR_RUNTIME, "the target graph returned new_k/new_v of an unexpected shape");
  const int64_t c_old = cached_;
  const size_t old_row = static_cast<size_t>(c_old * D) * elem_, new_row = static_cast<size_t>(s * D) * elem_;
  const size_t kept_row = static_cast<size_t>(keep * D) * elem_;
  auto merge = [&](std::vector<uint8_t>& cache, const uint8_t* src) {
    std::vector<uint8_t> out(static_cast<size_t>(H) * (old_row + kept_row));
    for (int64_t h = 0; h < H; ++h) {
      uint8_t* dst = out.data() + h * (old_row + kept_row);
      if (old_row) std::memcpy(dst, cache.data() + h * old_row, old_row);
      std::memcpy(dst + old_row, src + h * new_row, kept_row);
    }
    cache.swap(out);
  };
  const size_t layer_bytes = static_cast<size_t>(H) * new_row;
  for (int64_t layer = 0; layer < L; ++layer) {
    merge(k_[layer], static_cast<const uint8_t*>(new_k.data()) + layer * layer_bytes);
    merge(v_[layer], static_cast<const uint8_t*>(new_v.data()) + layer * layer_bytes);
  }
}

std::vector<uint8_t> TargetEngine::block_causal_bias(int64_t s) const {
  // additive mask [S, C + S]: the cache visible (earlier blocks); among the S tokens 0 where block(j) <= block(i)
  std::vector<uint8_t> bias(static_cast<size_t>(s * (cached_ + s)) * elem_, 0);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j) {
      if (j / b_ <= i / b_) continue;
      uint8_t* at = bias.data() + static_cast<size_t>(i * (cached_ + s) + cached_ + j) * elem_;
      if (elem_ == 4) {
        float ninf = -INFINITY;
        std::memcpy(at, &ninf, 4);
      } else {
        uint16_t h = fp16_neg_inf();
        std::memcpy(at, &h, 2);
      }
    }
  return bias;
}

void TargetEngine::prefill(const std::vector<int64_t>& ids) {
  check_ids(ids, "prefill ids");
  if (ids.size() % static_cast<size_t>(b_) != 0)
    fail(SPOT_ERR_INVALID_ARGUMENT, "prefill ids: got " + std::to_string(ids.size()) +
                                        ", expected a multiple of " + std::to_string(b_));
  for (auto& layer : k_) layer.clear();
  for (auto& layer : v_) layer.clear();
  device_k_.clear();
  device_v_.clear();
  cached_ = 0;
  if (ids.empty()) return;
  const int64_t p = static_cast<int64_t>(ids.size());
  check_room(p);
  // in chunks of max_nodes x B tokens, as the Python engine: no prefill pass needs more activation memory than the
  // widest verify pass the export was planned for (ONNX Runtime computes every output, the logits included); on
  // device trt the TensorRT profile's longest pass (one block: spot.folder.trt_profile.dynamic_trt_profile says why)
  const int64_t chunk = graphs_->prefill_chunk > 0 ? graphs_->prefill_chunk : std::max<int64_t>(b_, max_nodes_ * b_);
  for (int64_t start = 0; start < p; start += chunk) {
    const int64_t s = std::min(chunk, p - start);
    extend(std::vector<int64_t>(ids.begin() + start, ids.begin() + start + s), s, block_causal_bias(s));
    cached_ += s;
  }
}

void TargetEngine::check_states(const std::vector<int64_t>& states, int64_t n) const {
  check_ids(states, "block states");
  if (n < 1 || states.size() != static_cast<size_t>(n * b_))
    fail(SPOT_ERR_INVALID_ARGUMENT, "block states: expected [N>=1, " + std::to_string(b_) + "]");
  check_room(b_);
  if (n > max_nodes_)
    fail(SPOT_ERR_INVALID_ARGUMENT, std::to_string(n) + " candidate states in one pass exceed the export's "
                                                         "max_nodes " + std::to_string(max_nodes_) +
                                        ": re-export with a larger --max-nodes or draft fewer nodes");
}

namespace {

// No NaN or inf among x[0 .. count): an OR over the exponent bits, which the compiler vectorises (std::isfinite
// per value, with an early exit, does not)
bool all_finite(const float* x, size_t count) {
  uint32_t all_ones = 0;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);   // the float's bits (memcpy: no aliasing trouble, a plain load)
    all_ones |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return all_ones == 0;
}

void non_finite(int64_t position) {
  fail(SPOT_ERR_RUNTIME, "the ort engine produced non-finite logits (NaN or inf) for the block at position " +
                             std::to_string(position) + ": the weights or the export are broken, or fp16 "
                                                        "overflowed: try an fp32 export");
}

// An epilogue output as a host vector of T, checked against its expected element type and shape.
template <typename T>
std::vector<T> epilogue_array(const OrtOutput& out, ONNXTensorElementDataType type, const std::vector<int64_t>& shape,
                              const std::string& name, const std::string& graph) {
  if (out.type() != type || out.shape() != shape)
    fail(SPOT_ERR_INCOMPATIBLE, graph + " returned " + name + " of an unexpected type or shape: not a sampling "
                                        "epilogue this host reads (re-export the folder, or use the host sampler)");
  size_t count = 1;
  for (int64_t d : shape) count *= static_cast<size_t>(d);
  const T* p = static_cast<const T*>(out.data());
  return std::vector<T>(p, p + count);
}

}  // namespace

OrtOutput TargetEngine::block_device_logits(const std::vector<int64_t>& states, int64_t n) {
  if (!graphs_->epilogue) fail(SPOT_ERR_INTERNAL, "block_device_logits without the device sampler");
  check_states(states, n);
  const std::vector<int64_t> pos = positions(b_);
  const std::vector<uint8_t> bias = step_bias();
  Feeds f = feeds(states, n, b_, bias, pos);
  std::vector<OrtOutput> kept = graphs_->session->run_keeping(f.names, f.host, {"logits"}, *graphs_->place, f.device);
  if (kept[0].shape() != std::vector<int64_t>{n, b_, cfg_.vocab_size} ||
      kept[0].type() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
    fail(SPOT_ERR_RUNTIME, "the target graph returned logits of an unexpected shape or type");
  return std::move(kept[0]);
}

EpilogueResult TargetEngine::sample_state(const OrtOutput& logits, int64_t row, const std::vector<int64_t>& state,
                                          int64_t step, const Sampling& sampling, uint32_t block) {
  if (!graphs_->epilogue) fail(SPOT_ERR_INTERNAL, "sample_state without the device sampler");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t seed = sampling.seed, blk = block;   // the epilogue's scalars (top-p is refused upstream)
  const std::vector<std::string> names = {"node_steps", "seed", "block", "temperature", "top_k", "exclude_token",
                                         "first_position"};
  int64_t first = 0;
  std::vector<InputTensor> scalars = {
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {1}, &step, sizeof(int64_t)},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {}, &seed, sizeof(int64_t)},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {}, &blk, sizeof(int64_t)},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, {}, &sampling.temperature, sizeof(double)},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {}, &sampling.top_k, sizeof(int64_t)},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {}, &sampling.exclude_token, sizeof(int64_t)},
      {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, {}, &first, sizeof(int64_t)},   // the run's first position
  };
  const int64_t p = graphs_->epilogue_positions, d = graphs_->epilogue_steps, v = cfg_.vocab_size;
  const std::string& g = graphs_->epilogue_graph_path;
  const auto I64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, F64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
  EpilogueResult r;
  r.n = 1;
  r.b = b_;
  r.d = d;
  r.token.resize(b_);
  r.confidence.resize(b_);
  r.future_tokens.resize(d * b_);
  r.future_conf.resize(d * b_);
  r.top_logprobs.resize(b_ * 32);
  r.future_runner_up.resize(d * b_);
  r.future_gap.resize(d * b_);
  // a run's [1, P] / [1, D, P] / [1, P, 32] output into the state's [B] / [D, B] / [B, 32] at positions first..
  auto put = [&](auto& dst, const auto& src, int64_t rows, int64_t width) {
    for (int64_t j = 0; j < rows; ++j)
      std::copy(src.begin() + j * p * width, src.begin() + (j + 1) * p * width, dst.begin() + (j * b_ + first) * width);
  };
  for (first = 0; first < b_; first += p) {   // runs of the export's positions per call (memory)
    const OrtOutput rows = logits.view(static_cast<size_t>((row * b_ + first) * v), {1, p, v});   // in place
    std::vector<OrtOutput> out;
    try {
      out = graphs_->epilogue->run(names, scalars, kEpilogueOutputs, {{"logits", rows.value()}});
    } catch (const SpotException&) {
      // NaN / inf logits can send the epilogue's candidate indices out of range: a pass over this state with host
      // logits tells (block_logits' non-finite error) whether that was it; the walk reads a pass's outputs before
      // the next store, so the cache is the one the pass ran against
      block_logits(state, 1);
      throw;
    }
    put(r.token, epilogue_array<int64_t>(out[0], I64, {1, p}, "token", g), 1, 1);
    put(r.confidence, epilogue_array<double>(out[1], F64, {1, p}, "confidence", g), 1, 1);
    put(r.future_tokens, epilogue_array<int64_t>(out[2], I64, {1, d, p}, "future_tokens", g), d, 1);
    put(r.future_conf, epilogue_array<double>(out[3], F64, {1, d, p}, "future_conf", g), d, 1);
    put(r.top_logprobs, epilogue_array<float>(out[4], ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, {1, p, 32},
                                              "top_logprobs", g), 1, 32);
    put(r.future_runner_up, epilogue_array<int64_t>(out[5], I64, {1, d, p}, "future_runner_up", g), d, 1);
    put(r.future_gap, epilogue_array<double>(out[6], F64, {1, d, p}, "future_gap", g), d, 1);
  }
  ++epilogue_states_;
  epilogue_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (double c : r.confidence)   // NaN / inf logits make the softmax non-finite
    if (!std::isfinite(c)) non_finite(cached_);
  return r;
}

void TargetEngine::check_finite_rows(const float* rows, size_t count) const {
  if (!all_finite(rows, count)) non_finite(cached_);
}

HostLogits TargetEngine::block_logits(const std::vector<int64_t>& states, int64_t n, bool check_finite) {
  check_states(states, n);
  std::vector<OrtOutput> out = run({"logits"}, states, n, b_, step_bias());
  std::vector<int64_t> want = {n, b_, cfg_.vocab_size};
  if (out[0].shape() != want || out[0].type() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
    fail(SPOT_ERR_RUNTIME, "the target graph returned logits of an unexpected shape or type");
  HostLogits logits(std::move(out[0]));
  if (check_finite && !all_finite(logits.data(), static_cast<size_t>(n * b_ * cfg_.vocab_size))) non_finite(cached_);
  return logits;
}

OrtOutput TargetEngine::fused_pass(const std::vector<int64_t>& store, const std::vector<int64_t>& state,
                                   const MemoryPlace& logits_place) {
  check_ids(store, "store state");
  if (store.size() != static_cast<size_t>(b_))
    fail(SPOT_ERR_INVALID_ARGUMENT, "store state: expected [" + std::to_string(b_) + "]");
  check_states(state, 1);
  check_room(2 * b_);
  if (graphs_->prefill_chunk > 0 && graphs_->prefill_chunk < 2 * b_)   // device trt: the profile's longest pass
    fail(SPOT_ERR_INCOMPATIBLE, "the folder's TensorRT shape profile takes passes of one block, the fused store pass "
                                "runs two (" + std::to_string(2 * b_) + " tokens): run `spot upgrade-export` on the "
                                "folder (seconds: it records the profile again), or use SPOT_STORE_SEPARATE");
  std::vector<int64_t> ids(store);
  ids.insert(ids.end(), state.begin(), state.end());
  const std::vector<int64_t> pos = positions(2 * b_);
  const std::vector<uint8_t> bias = block_causal_bias(2 * b_);
  Feeds f = feeds(ids, 1, 2 * b_, bias, pos);
  const MemoryPlace& kv_place = *graphs_->host_place;   // (append_device_kv_from_host says why)
  std::vector<OrtOutput> out = graphs_->session->run_placed(f.names, f.host, {"logits", "new_k", "new_v"},
                                                            {&logits_place, &kv_place, &kv_place}, f.device);
  if (out[0].shape() != std::vector<int64_t>{1, 2 * b_, cfg_.vocab_size} ||
      out[0].type() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
    fail(SPOT_ERR_RUNTIME, "the target graph returned logits of an unexpected shape or type");
  if (graphs_->kv_append)
    append_device_kv_from_host(out[1], out[2], 2 * b_, b_);
  else
    append_host_kv(out[1], out[2], 2 * b_, b_);
  cached_ += b_;
  return std::move(out[0]);
}

HostLogits TargetEngine::fused_logits(const std::vector<int64_t>& store, const std::vector<int64_t>& state) {
  return HostLogits(fused_pass(store, state, *graphs_->host_place), static_cast<size_t>(b_ * cfg_.vocab_size));
}

OrtOutput TargetEngine::fused_device_logits(const std::vector<int64_t>& store, const std::vector<int64_t>& state) {
  if (!graphs_->epilogue) fail(SPOT_ERR_INTERNAL, "fused_device_logits without the device sampler");
  return fused_pass(store, state, *graphs_->place);
}

void TargetEngine::store(const std::vector<int64_t>& state) {
  check_ids(state, "store state");
  if (state.size() != static_cast<size_t>(b_))
    fail(SPOT_ERR_INVALID_ARGUMENT, "store state: expected [" + std::to_string(b_) + "]");
  check_room(b_);
  extend(state, b_, step_bias());
  cached_ += b_;
}

}  // namespace spot
