// The C API of include/spot/spot.h: exceptions stop here and become (status, message).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "bounds.h"
#include "decode.h"
#include "drafter.h"
#include "engine.h"
#include "errors.h"
#include "paths.h"
#include "spot/spot.h"
#include "step.h"

static_assert(SPOT_MAX_STOP_IDS == spot::kMaxStopIds, "the header's bound is the manifest's (bounds.h)");

namespace {

// What a model handle and its contexts share, unchanged once opened: the folder, its sessions (the weights, once)
// and the drafter (its Run is thread-safe too). Held by the handle and each context: the last one releases it.
struct OpenedModel {
  spot::ExportedFolder folder;
  std::shared_ptr<const spot::TargetGraphs> graphs;
  std::unique_ptr<spot::Drafter> drafter;
  // the folder's own drafter.onnx (found, not named) failed to load or fit: the error of spot / spot-sets, which
  // need it; the other decoders run without it (as `spot generate` looks for a drafter only for those two)
  spot_status drafter_status = SPOT_OK;
  std::string drafter_message;
  std::string ort_version;
};

}  // namespace

// One decoder: its own engine (KV cache) over the shared graphs.
struct spot_context {
  spot_context(std::shared_ptr<OpenedModel> m, spot_model* by)
      : model(std::move(m)), engine(model->graphs), owner(by) {}
  std::shared_ptr<OpenedModel> model;
  spot::TargetEngine engine;
  // one request at a time (one KV cache): a second thread or an on_block calling back in is refused, not
  // interleaved into the first request's cache (as spot.runtime.decode.generate's request lock); a close meanwhile
  // is carried out when the request returns (deleting the decoder under it was a use-after-free)
  std::mutex lock;
  bool busy = false;
  bool close_requested = false;
  spot_model* owner;   // the model handle whose own decoder this is (freed with it); null: spot_context_open's
};

// The handle spot_open returns: the opened model and its own decoder (spot_generate's).
struct spot_model {
  std::shared_ptr<OpenedModel> opened;
  std::unique_ptr<spot_context> own;
};

namespace {

spot_status set_error(spot_error* err, spot_status code, const std::string& message) {
  if (err != nullptr) {
    err->code = code;
    std::snprintf(err->message, sizeof(err->message), "%s", message.c_str());
  }
  return code;
}

spot_status ok(spot_error* err) { return set_error(err, SPOT_OK, ""); }

template <typename F>
spot_status guarded(spot_error* err, F&& body) {
  try {
    body();
    return ok(err);
  } catch (const spot::SpotException& e) {
    return set_error(err, e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return set_error(err, SPOT_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return set_error(err, SPOT_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return set_error(err, SPOT_ERR_INTERNAL, "internal error (unknown exception)");
  }
}

const char* kDecoderNames[] = {"standard", "threshold", "chain", "tree", "spot", "spot-sets"};

// An open option's C enum value as the host's enum: table[i] is what C value i means; false when out of range.
template <typename T, size_t N>
bool map_option(int value, const T (&table)[N], T* out) {
  if (value < 0 || static_cast<size_t>(value) >= N) return false;
  *out = table[value];
  return true;
}

constexpr int kMaxThreads = 256;   // spot.engines.ort_engine.MAX_THREADS
constexpr spot::Device kDevices[] = {spot::Device::kCpu, spot::Device::kCuda, spot::Device::kTensorRT};
// spot_sampler and spot_kv_cache share their values: AUTO, HOST, DEVICE
constexpr spot::Placement kPlacements[] = {spot::Placement::kAuto, spot::Placement::kHost, spot::Placement::kDevice};

}  // namespace

extern "C" {

void spot_open_options_init(spot_open_options* o) {
  if (o == nullptr) return;
  o->drafter_dir = nullptr;
  o->verify = SPOT_VERIFY_QUICK;
  o->threads = 0;
  o->device = SPOT_DEVICE_CPU;
  o->sampler = SPOT_SAMPLER_AUTO;
  o->kv_cache = SPOT_KV_CACHE_AUTO;
}

void spot_generate_options_init(spot_generate_options* o) {
  if (o == nullptr) return;
  o->decoder = SPOT_DECODER_STANDARD;
  o->temperature = 0.0;
  o->seed = 0;
  o->tau = 0.9;
  o->max_new_tokens = 64;
  o->budget = 16;
  o->depth = 0;   // min(8, block size) at generate time
  o->mode = SPOT_MODE_STATIC;
  o->top_k = 0;
  o->top_p = 1.0;
  o->stop_ids = nullptr;
  o->n_stop_ids = 0;
  o->store_mode = SPOT_STORE_FUSED;
}

spot_status spot_open(const char* folder, const spot_open_options* options, spot_model** out, spot_error* err) {
  if (out == nullptr) return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_open: out is NULL");
  *out = nullptr;
  if (folder == nullptr) return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_open: folder is NULL");
  spot_open_options opts;
  spot_open_options_init(&opts);
  if (options != nullptr) opts = *options;
  if (opts.verify != SPOT_VERIFY_QUICK && opts.verify != SPOT_VERIFY_FULL && opts.verify != SPOT_VERIFY_NONE)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_open: unknown verify level");
  if (opts.threads < 0 || opts.threads > kMaxThreads)   // ORT makes each thread up front: 100000 exhausted memory
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT,
                     "spot_open: threads must be in 0.." + std::to_string(kMaxThreads) +
                         " (0 = ONNX Runtime's default), got " + std::to_string(opts.threads));
  spot::Device device;
  spot::Placement sampler;
  spot::Placement kv_cache;
  if (!map_option(opts.device, kDevices, &device))
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_open: unknown device " + std::to_string(opts.device) +
                                                         ", expected SPOT_DEVICE_CPU, _CUDA or _TENSORRT");
  if (!map_option(opts.sampler, kPlacements, &sampler))
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_open: unknown sampler " + std::to_string(opts.sampler) +
                                                         ", expected SPOT_SAMPLER_AUTO, _HOST or _DEVICE");
  if (!map_option(opts.kv_cache, kPlacements, &kv_cache))
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_open: unknown KV cache place " +
                                                         std::to_string(opts.kv_cache) +
                                                         ", expected SPOT_KV_CACHE_AUTO, _HOST or _DEVICE");
  spot_model* model = nullptr;
  // the whole open (manifest, file checks, ORT sessions, drafter) reads one folder: if the path names another one
  // afterwards (replaced by rename, or a link re-pointed — docs/deployment.md), its files may have been read from
  // both, so it is opened again, once (spot.engines.ort_engine.OrtEngine does the same)
  auto open_once = [&]() {
    auto m = std::make_shared<OpenedModel>();
    m->folder = spot::load_exported_folder(folder, opts.verify);
    m->ort_version = spot::ort_version();
    m->graphs = std::make_shared<const spot::TargetGraphs>(m->folder, opts.threads, device, sampler, kv_cache);
    std::string drafter_dir;
    if (opts.drafter_dir != nullptr) {
      drafter_dir = opts.drafter_dir;
      if (!spot::is_dir(drafter_dir) && !spot::is_file(drafter_dir))
        spot::fail(SPOT_ERR_NOT_FOUND, "drafter folder " + drafter_dir + " does not exist");
    } else if (spot::is_file(spot::join(folder, "drafter.onnx"))) {
      drafter_dir = folder;
    }
    if (!drafter_dir.empty()) {
      try {
        auto drafter = spot::Drafter::load(drafter_dir);
        // refuse a mismatched drafter at open: spot / spot-sets with it could never run
        drafter->check_compatible(m->graphs->b, m->folder.config);
        m->drafter = std::move(drafter);
      } catch (const spot::SpotException& e) {
        if (opts.drafter_dir != nullptr) throw;      // the caller named it
        m->drafter_status = e.code();
        m->drafter_message = std::string(e.what()) + " (the drafter beside the model, which spot and spot-sets use)";
      }
    }
    return m;
  };
  spot_status st = guarded(err, [&]() {
    for (int attempt = 0;; ++attempt) {
      const auto before = spot::folder_identity(folder);
      std::shared_ptr<OpenedModel> m;
      try {
        m = open_once();
      } catch (const spot::SpotException&) {
        if (attempt == 0 && spot::folder_identity(folder) != before) continue;
        throw;
      }
      if (attempt == 0 && spot::folder_identity(folder) != before) continue;
      auto handle = std::make_unique<spot_model>();
      handle->opened = m;
      handle->own = std::make_unique<spot_context>(m, handle.get());
      model = handle.release();
      return;
    }
  });
  if (st == SPOT_OK) *out = model;
  return st;
}

namespace {

// Free a decoder: a context, or the model handle whose own decoder it is (and that decoder with it).
void free_decoder(spot_context* ctx) {
  if (ctx->owner != nullptr)
    delete ctx->owner;
  else
    delete ctx;
}

// Close a decoder: now, or when its running request returns (a close from on_block or another thread).
void close_decoder(spot_context* ctx) {
  {
    std::lock_guard<std::mutex> guard(ctx->lock);
    if (ctx->busy) {
      ctx->close_requested = true;
      return;
    }
  }
  free_decoder(ctx);
}

}  // namespace

void spot_close(spot_model* model) {
  if (model == nullptr) return;
  close_decoder(model->own.get());
}

spot_status spot_context_open(spot_model* model, spot_context** out, spot_error* err) {
  if (out == nullptr) return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_context_open: out is NULL");
  *out = nullptr;
  if (model == nullptr) return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_context_open: model is NULL");
  spot_context* ctx = nullptr;
  spot_status st = guarded(err, [&]() { ctx = new spot_context(model->opened, nullptr); });
  if (st == SPOT_OK) *out = ctx;
  return st;
}

void spot_context_close(spot_context* context) {
  if (context == nullptr || context->owner != nullptr) return;   // a model's own decoder closes with spot_close
  close_decoder(context);
}

spot_status spot_model_get_info(const spot_model* model, spot_model_info* info, spot_error* err) {
  if (model == nullptr || info == nullptr)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_model_get_info: NULL argument");
  const OpenedModel& m = *model->opened;
  const spot::TargetEngine& engine = model->own->engine;
  info->vocab_size = m.folder.config.vocab_size;
  info->block_size = engine.block_size();
  info->mask_token_id = m.folder.config.mask_token_id;
  info->max_nodes = engine.max_nodes();
  info->max_context = engine.max_context();
  info->has_drafter = m.drafter != nullptr;
  info->dtype = m.folder.dtype.c_str();
  info->ort_version = m.ort_version.c_str();
  info->samples_on_device = engine.samples_on_device();
  info->cache_on_device = engine.cache_on_device();
  return ok(err);
}

namespace {

// Whether prompt + max_new_tokens fit the model's context, as run_decoder counts them (whole blocks), with no size
// arithmetic that can overflow: n_prompt is a caller's size_t (2**62 times 8 bytes wrapped to an empty prompt when
// the ids were copied), so it is compared with the context before anything is added to it or multiplied.
bool request_fits(const spot::TargetEngine& engine, size_t n_prompt, int max_new_tokens) {
  const int64_t context = engine.max_context(), b = engine.block_size();
  if (max_new_tokens < 1 || n_prompt > static_cast<size_t>(context)) return false;
  const int64_t blocks = (static_cast<int64_t>(n_prompt) + max_new_tokens + b - 1) / b;   // < 2**25 + 2**31
  return blocks * b <= context;
}

size_t output_capacity(const spot::TargetEngine& engine, size_t n_prompt, int max_new_tokens) {
  // 0 for a request spot_generate refuses for its sizes: a caller sizing its buffer by this never allocates for one
  return request_fits(engine, n_prompt, max_new_tokens) ? static_cast<size_t>(max_new_tokens) : 0;
}

spot_status generate_on(spot_context* model, const int64_t* prompt, size_t n_prompt,
                        const spot_generate_options* options, spot_block_callback on_block, void* user_data,
                        int64_t* out_ids, size_t out_capacity, size_t* out_len, spot_stats* stats, spot_error* err);

}  // namespace

size_t spot_output_capacity(const spot_model* model, size_t n_prompt, int max_new_tokens) {
  return model == nullptr ? 0 : output_capacity(model->own->engine, n_prompt, max_new_tokens);
}

spot_status spot_generate(spot_model* model, const int64_t* prompt, size_t n_prompt,
                          const spot_generate_options* options, int64_t* out_ids, size_t out_capacity,
                          size_t* out_len, spot_stats* stats, spot_error* err) {
  return spot_generate_stream(model, prompt, n_prompt, options, nullptr, nullptr, out_ids, out_capacity, out_len,
                              stats, err);
}

spot_status spot_generate_stream(spot_model* model, const int64_t* prompt, size_t n_prompt,
                                 const spot_generate_options* options, spot_block_callback on_block,
                                 void* user_data, int64_t* out_ids, size_t out_capacity, size_t* out_len,
                                 spot_stats* stats, spot_error* err) {
  if (model == nullptr) {
    if (out_len != nullptr) *out_len = 0;
    if (stats != nullptr) *stats = spot_stats{};
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_generate: model is NULL");
  }
  return generate_on(model->own.get(), prompt, n_prompt, options, on_block, user_data, out_ids, out_capacity,
                     out_len, stats, err);
}

spot_status spot_context_generate(spot_context* context, const int64_t* prompt, size_t n_prompt,
                                  const spot_generate_options* options, int64_t* out_ids, size_t out_capacity,
                                  size_t* out_len, spot_stats* stats, spot_error* err) {
  return spot_context_generate_stream(context, prompt, n_prompt, options, nullptr, nullptr, out_ids, out_capacity,
                                      out_len, stats, err);
}

spot_status spot_context_generate_stream(spot_context* context, const int64_t* prompt, size_t n_prompt,
                                         const spot_generate_options* options, spot_block_callback on_block,
                                         void* user_data, int64_t* out_ids, size_t out_capacity, size_t* out_len,
                                         spot_stats* stats, spot_error* err) {
  if (context == nullptr) {
    if (out_len != nullptr) *out_len = 0;
    if (stats != nullptr) *stats = spot_stats{};
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_context_generate: context is NULL");
  }
  return generate_on(context, prompt, n_prompt, options, on_block, user_data, out_ids, out_capacity, out_len, stats,
                     err);
}

}  // extern "C"

namespace {

// spot_generate_stream on one decoder: the model handle's own (spot_generate) or a context's.
spot_status generate_on(spot_context* model, const int64_t* prompt, size_t n_prompt,
                        const spot_generate_options* options, spot_block_callback on_block, void* user_data,
                        int64_t* out_ids, size_t out_capacity, size_t* out_len, spot_stats* stats, spot_error* err) {
  // what a caller reads after a failure is zero, not its buffer's earlier contents
  if (out_len != nullptr) *out_len = 0;
  if (stats != nullptr) *stats = spot_stats{};
  if (prompt == nullptr && n_prompt > 0)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_generate: prompt is NULL");
  if (out_ids == nullptr || out_len == nullptr)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_generate: out_ids / out_len is NULL");
  *out_len = 0;
  spot_generate_options o;
  spot_generate_options_init(&o);
  if (options != nullptr) o = *options;
  if (static_cast<int>(o.decoder) < 0 || static_cast<int>(o.decoder) > SPOT_DECODER_SPOT_SETS)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_generate: unknown decoder " +
                                                         std::to_string(static_cast<int>(o.decoder)));
  if (o.top_k < 0)    // the range of an int, as Python's Sampling (step.MAX_TOP_K)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "top_k must be in [0, 2147483647] (0 disables it), got " +
                                                         std::to_string(o.top_k));
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1], got " + spot::number_text(o.top_p));
  if (o.mode != SPOT_MODE_STATIC && o.mode != SPOT_MODE_THRESHOLD)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_generate: unknown mode");
  if (o.store_mode != SPOT_STORE_FUSED && o.store_mode != SPOT_STORE_SEPARATE)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_generate: unknown store_mode " +
                                                         std::to_string(static_cast<int>(o.store_mode)) +
                                                         ", expected SPOT_STORE_FUSED (0) or SPOT_STORE_SEPARATE (1)");
  if (o.stop_ids == nullptr && o.n_stop_ids > 0)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_generate: stop_ids is NULL but n_stop_ids > 0");
  // sizes before anything is sized by them (a prompt past the context can never decode; SPOT_MAX_STOP_IDS, as the
  // manifest's stop_ids): 2**62 ids wrapped to none, SIZE_MAX ran out of memory
  if (n_prompt > static_cast<size_t>(model->engine.max_context()))
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT,
                     "spot_generate: n_prompt " + std::to_string(n_prompt) + " exceeds the model's context of " +
                         std::to_string(model->engine.max_context()) + " tokens");
  if (o.n_stop_ids > static_cast<size_t>(SPOT_MAX_STOP_IDS))
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT,
                     "spot_generate: n_stop_ids " + std::to_string(o.n_stop_ids) + " exceeds SPOT_MAX_STOP_IDS (" +
                         std::to_string(SPOT_MAX_STOP_IDS) + ")");
  const size_t capacity = output_capacity(model->engine, n_prompt, o.max_new_tokens);
  if (o.max_new_tokens >= 1 && request_fits(model->engine, n_prompt, o.max_new_tokens) && out_capacity < capacity)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT,
                     "spot_generate: out_capacity " + std::to_string(out_capacity) + " is below the " +
                         std::to_string(capacity) + " ids this request may produce (spot_output_capacity)");
  bool was_busy;
  {
    std::lock_guard<std::mutex> guard(model->lock);
    was_busy = model->busy;
    model->busy = true;
  }
  if (was_busy)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT,
                     "spot_generate: this model is already decoding a request (one request at a time per handle or "
                     "context: it holds one KV cache); open a context per thread (spot_context_open: the weights "
                     "once), and do not call spot_generate from on_block");
  struct Release {     // the request's end: the decoder free again, or closed if a close came meanwhile
    spot_context* model;
    ~Release() {
      bool close;
      {
        std::lock_guard<std::mutex> guard(model->lock);
        model->busy = false;
        close = model->close_requested;
      }
      if (close) free_decoder(model);
    }
  } release{model};
  return guarded(err, [&]() {
    spot::DecodeRequest req;
    req.decoder = kDecoderNames[o.decoder];
    req.max_new_tokens = o.max_new_tokens;
    req.threshold_mode = o.mode == SPOT_MODE_THRESHOLD;
    req.tau = o.tau;
    req.separate_store = o.store_mode == SPOT_STORE_SEPARATE;
    req.temperature = o.temperature;
    req.seed = o.seed;
    req.top_k = o.top_k;
    req.top_p = o.top_p;
    req.budget = o.budget;
    req.depth = o.depth == 0 ? std::min<int64_t>(8, model->engine.block_size()) : o.depth;
    if (o.stop_ids != nullptr) req.stop_ids = std::vector<int64_t>(o.stop_ids, o.stop_ids + o.n_stop_ids);
    // after each block: the caller's on_block, and a spot_close made meanwhile ends the request there (stopped = 2)
    req.on_block = [model, on_block, user_data](const std::vector<int64_t>& ids) {
      bool stop = on_block != nullptr && on_block(ids.data(), ids.size(), user_data) != 0;
      std::lock_guard<std::mutex> guard(model->lock);
      return stop || model->close_requested;
    };
    const OpenedModel& shared = *model->model;
    if ((o.decoder == SPOT_DECODER_SPOT || o.decoder == SPOT_DECODER_SPOT_SETS) && shared.drafter_status != SPOT_OK)
      spot::fail(shared.drafter_status, shared.drafter_message);
    std::vector<int64_t> ids(prompt, prompt + n_prompt);
    spot::Generation gen = spot::run_decoder(model->engine, shared.folder.config, shared.drafter.get(), ids, req);
    if (gen.token_ids.size() > out_capacity) spot::fail(SPOT_ERR_INTERNAL, "output larger than its bound");
    std::copy(gen.token_ids.begin(), gen.token_ids.end(), out_ids);
    *out_len = gen.token_ids.size();
    if (stats != nullptr) {
      auto count = [&](const char* k) {
        auto it = gen.stats.passes.find(k);
        return it == gen.stats.passes.end() ? int64_t(0) : it->second;
      };
      stats->prefill_passes = count("prefill");
      stats->block_passes = count("block");
      stats->verify_passes = count("verify");
      stats->store_passes = count("store");
      stats->fused_passes = count("fused");
      stats->target_passes = stats->prefill_passes + stats->block_passes + stats->verify_passes +
                             stats->store_passes + stats->fused_passes;
      stats->steps = gen.stats.steps;
      stats->blocks = gen.stats.blocks;
      stats->stopped = gen.stopped ? 1 : gen.cancelled ? 2 : 0;
      stats->seconds = gen.stats.seconds;
      stats->draft_ms = gen.stats.draft_ms;
      stats->walk_ms = gen.stats.walk_ms;
      stats->epilogue_states = gen.stats.epilogue_states;
      stats->epilogue_ms = gen.stats.epilogue_ms;
      stats->target_ms = gen.stats.target_ms;
    }
  });
}

}  // namespace

extern "C" {

double spot_gumbel(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, uint32_t token) {
  return spot::gumbel(seed, block, step, position, token);
}

double spot_uniform(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, uint32_t token, uint32_t* a,
                    uint32_t* b) {
  uint32_t wa = spot::mix32(spot::lane_prefix(0x9E3779B9u, seed, block, step, position) ^ token);
  uint32_t wb = spot::mix32(spot::lane_prefix(0x7F4A7C15u, seed, block, step, position) ^ token);
  if (a) *a = wa;
  if (b) *b = wb;
  return spot::uniform_from_words(wa, wb);
}

int spot_abi_version(void) { return SPOT_ABI_VERSION; }

const char* spot_decoder_name(spot_decoder decoder) {
  int d = static_cast<int>(decoder);
  return (d >= 0 && d <= SPOT_DECODER_SPOT_SETS) ? kDecoderNames[d] : "unknown";
}

spot_status spot_decoder_from_name(const char* name, spot_decoder* out, spot_error* err) {
  if (name == nullptr || out == nullptr)
    return set_error(err, SPOT_ERR_INVALID_ARGUMENT, "spot_decoder_from_name: NULL argument");
  for (int d = 0; d <= SPOT_DECODER_SPOT_SETS; ++d)
    if (std::strcmp(name, kDecoderNames[d]) == 0) {
      *out = static_cast<spot_decoder>(d);
      return ok(err);
    }
  if (std::strcmp(name, "oracle") == 0 || std::strcmp(name, "order-oracle") == 0)
    return set_error(err, SPOT_ERR_UNSUPPORTED,
                     std::string("the ") + name + " decoder is a Python-runtime diagnostic, not in the C++ host");
  return set_error(err, SPOT_ERR_INVALID_ARGUMENT, std::string("unknown decoder '") + name +
                                                       "', expected one of standard, threshold, chain, tree, spot, "
                                                       "spot-sets");
}

}  // extern "C"
