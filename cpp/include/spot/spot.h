/* spot: SPOT / SPOT-Sets block-diffusion decoding of an exported folder through ONNX Runtime (C API).
 *
 * Contract (docs/cpp-host.md):
 * - Token ids in, token ids out; outputs are bit-identical to the Python runtime (spot.runtime) for the same folder,
 *   prompt and options: standard, threshold, chain, tree, spot and spot-sets decoding.
 * - Every function reports failure by a status code and, when `err` is not NULL, a message; none aborts on bad input.
 * - One spot_generate at a time per spot_model (open one handle per thread): a call while another is running on the
 *   same handle (another thread, or an on_block calling back in) returns SPOT_ERR_INVALID_ARGUMENT.
 * - Many requests at once over one copy of the weights: spot_context_open makes more decoders over an opened model,
 *   each with its own KV cache, sharing the model's ONNX Runtime sessions (see spot_context below).
 */
#ifndef SPOT_SPOT_H
#define SPOT_SPOT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPOT_VERSION "0.1.0"
/* The binary interface: the layout of every struct and enum here and every function's signature. Raised with any
 * change to them, together with the library's SONAME (libspot.so.<SPOT_ABI_VERSION>, cpp/CMakeLists.txt reads it
 * from here). An application checks spot_abi_version() == SPOT_ABI_VERSION before its first call: a library
 * built from another header would read and write structs of another size. */
#define SPOT_ABI_VERSION 2
/* The most stop ids a request may name (spot_generate_options.n_stop_ids), as a manifest's stop_ids. */
#define SPOT_MAX_STOP_IDS 1024

#if defined(_WIN32)
#define SPOT_API __declspec(dllexport)
#else
#define SPOT_API __attribute__((visibility("default")))
#endif

typedef enum spot_status {
  SPOT_OK = 0,
  SPOT_ERR_INVALID_ARGUMENT = 1, /* an option, a pointer or a token id out of range */
  SPOT_ERR_NOT_FOUND = 2,        /* a folder or file that does not exist */
  SPOT_ERR_CORRUPT = 3,          /* a file that differs from its manifest, or an unreadable manifest */
  SPOT_ERR_INCOMPATIBLE = 4,     /* a drafter trained for another target or block size, a foreign graph */
  SPOT_ERR_UNSUPPORTED = 5,      /* not here: the oracle decoders, top-p with the device sampler, a GPU provider
                                    the linked ONNX Runtime lacks */
  SPOT_ERR_RUNTIME = 6,          /* ONNX Runtime failed, or the model produced non-finite logits */
  SPOT_ERR_INTERNAL = 7          /* out of memory or a bug: please report */
} spot_status;

typedef struct spot_error {
  spot_status code;
  char message[1024]; /* NUL-terminated, "" when code is SPOT_OK */
} spot_error;

typedef struct spot_model spot_model; /* opaque */

typedef enum spot_verify {
  SPOT_VERIFY_QUICK = 0, /* sizes; sha256 of files <= 64 MiB, sampled sha256 of larger ones (the default) */
  SPOT_VERIFY_FULL = 1,  /* full sha256 of every file */
  SPOT_VERIFY_NONE = 2   /* existence only */
} spot_verify;

/* Where the target graph runs (the drafter, a few kB, always runs on the CPU). The GPU devices need the host linked
 * against an onnxruntime-gpu library; with the device sampler the logits stay on the device, with the device KV
 * cache the cache does (docs/cpp-host.md). Not yet run on a GPU by this project. */
typedef enum spot_device {
  SPOT_DEVICE_CPU = 0,     /* ONNX Runtime's CPU execution provider (the default) */
  SPOT_DEVICE_CUDA = 1,    /* the CUDA execution provider */
  SPOT_DEVICE_TENSORRT = 2 /* TensorRT, CUDA for what it does not take; engines cached in $SPOT_CACHE/trt/. Shape
                              ranges from the manifest's graphs.target.tensorrt_profile (a folder without one is
                              SPOT_ERR_INCOMPATIBLE: run `spot upgrade-export`); docs/gpu-path.md */
} spot_device;

/* Where F's sampling runs (the Python runtime's --sampler). HOST: the target's logits come to the host loop.
 * DEVICE: the export's sampling epilogue (epilogue.onnx, docs/gpu-path.md) runs next to the target on its device and
 * only its samples come back (a GPU keeps the [N, B, V] logits); the same tokens bit for bit, no top-p, trees no
 * deeper than the epilogue's future steps. AUTO: DEVICE on a GPU device when the folder has an epilogue. */
typedef enum spot_sampler { SPOT_SAMPLER_AUTO = 0, SPOT_SAMPLER_HOST = 1, SPOT_SAMPLER_DEVICE = 2 } spot_sampler;

/* Where the KV cache lives (the Python runtime's --kv-cache). HOST: host memory, sent to the target's device with
 * every pass (~300 MB per pass for SDAR-8B at 2k tokens of context). DEVICE: OrtValues where the target runs, each
 * stored block appended there by the export's kv_append.onnx (one device-side copy per block); the same tokens.
 * AUTO: DEVICE on a GPU device when the folder has kv_append.onnx. */
typedef enum spot_kv_cache { SPOT_KV_CACHE_AUTO = 0, SPOT_KV_CACHE_HOST = 1, SPOT_KV_CACHE_DEVICE = 2 } spot_kv_cache;

typedef struct spot_open_options {
  const char* drafter_dir; /* folder with drafter.onnx + drafter.json, refused at open if broken or for another
                              target; NULL: the model folder's own, if any — if that one is broken or foreign, the
                              model still opens (has_drafter 0) and spot / spot-sets fail with its error */
  spot_verify verify;
  int threads;             /* intra-op threads of the target session; 0: ONNX Runtime's default */
  spot_device device;      /* SPOT_DEVICE_CPU unless set */
  spot_sampler sampler;    /* SPOT_SAMPLER_AUTO unless set */
  spot_kv_cache kv_cache;  /* SPOT_KV_CACHE_AUTO unless set */
} spot_open_options;

typedef enum spot_decoder {
  SPOT_DECODER_STANDARD = 0,  /* one target pass per commit step, static rule */
  SPOT_DECODER_THRESHOLD = 1, /* one target pass per commit step, threshold rule (tau) */
  SPOT_DECODER_CHAIN = 2,     /* SPOT with the stale-confidence order, one candidate per depth */
  SPOT_DECODER_TREE = 3,      /* SPOT with the stale-confidence order, 4 candidates per node */
  SPOT_DECODER_SPOT = 4,      /* SPOT with the learned order model (needs a drafter), static rule */
  SPOT_DECODER_SPOT_SETS = 5  /* SPOT-Sets with the learned order model (needs a drafter), threshold rule */
} spot_decoder;

typedef enum spot_mode { SPOT_MODE_STATIC = 0, SPOT_MODE_THRESHOLD = 1 } spot_mode;

/* Where a finished block's K/V are cached (docs/spec.md §1). FUSED: the next block's first pass runs the finished
 * block and its own state as 2B tokens and caches the first B (the last block is never stored). SEPARATE: a store
 * pass of its own after each block, as SDAR's decoder counts passes. The same decoder gives the same tokens as
 * standard decoding in either mode; the modes may differ from each other in the K/V's last bits. */
typedef enum spot_store_mode { SPOT_STORE_FUSED = 0, SPOT_STORE_SEPARATE = 1 } spot_store_mode;

typedef struct spot_generate_options {
  spot_decoder decoder;
  double temperature;      /* 0 = argmax; >= 1e-6 = Gumbel-max sampling with the counter noise */
  uint32_t seed;           /* noise seed */
  double tau;              /* threshold rule: commit every masked position with confidence > tau */
  int max_new_tokens;      /* >= 1: the most ids returned (decoding runs to the block boundary covering prompt +
                              max_new_tokens; the ids past it finish the last block and are not returned) */
  int budget;              /* tree/spot/spot-sets: nodes per verify pass (root included), >= 1 */
  int depth;               /* chain/tree/spot/spot-sets: deepest node below the root, 1..block size; 0 (the
                              default): 8, or the block size if smaller (spot generate's default) */
  spot_mode mode;          /* commit rule of standard, chain, tree and spot (threshold and spot-sets: always
                              threshold); standard + SPOT_MODE_THRESHOLD = threshold decoding, as in Python */
  int top_k;               /* >= 0; 0 disables top-k filtering (T > 0 only; confidences stay unfiltered) */
  double top_p;            /* in (0, 1]; 1 disables top-p filtering (T > 0 only, after top-k) */
  const int64_t* stop_ids; /* NULL: the manifest's stop ids; otherwise n_stop_ids ids (0: none — a non-NULL
                              pointer: an empty std::vector's data() may be NULL) */
  size_t n_stop_ids;       /* at most SPOT_MAX_STOP_IDS (more: SPOT_ERR_INVALID_ARGUMENT) */
  spot_store_mode store_mode; /* SPOT_STORE_FUSED unless set */
} spot_generate_options;

typedef struct spot_stats {
  int64_t target_passes; /* prefill + block + verify + store + fused */
  int64_t prefill_passes, block_passes, verify_passes, store_passes;
  int64_t fused_passes;  /* a block's first pass that stored the block before it (SPOT_STORE_FUSED); store_passes:
                            separate store passes (SPOT_STORE_SEPARATE) */
  int64_t steps;         /* commit steps */
  int64_t blocks;        /* finished blocks */
  int stopped;           /* 1: a stop id ended the output (before max_new_tokens); 2: the on_block callback ended
                            generation (spot_generate_stream) */
  double seconds;        /* wall time of the whole call */
  double draft_ms;       /* per call: stale view, proposer (drafter) and tree building, all verify rounds */
  double walk_ms;        /* per call: the exact walk over the fresh logits, all verify rounds */
  double target_ms;      /* per call: the target passes the decoder timed — the verify passes of chain / tree / spot
                            / spot-sets, every block pass of standard / threshold decoding (as the Python runtime) */
  int64_t epilogue_states; /* states the device sampling epilogue sampled (the states the walk read, once per
                              commit step for every decoder); 0 with the host sampler */
  double epilogue_ms;      /* per call: time inside those epilogue runs (included in walk_ms for SPOT rounds) */
} spot_stats;

typedef struct spot_model_info {
  int64_t vocab_size, block_size, mask_token_id, max_nodes, max_context;
  int has_drafter;
  const char* dtype;     /* "fp32" or "fp16" */
  const char* ort_version; /* the ONNX Runtime library's; both strings owned by the model, valid until spot_close */
  int samples_on_device; /* 1: F's sampling runs in the export's epilogue (spot_open_options.sampler resolved) */
  int cache_on_device;   /* 1: the KV cache lives where the target runs (spot_open_options.kv_cache resolved) */
} spot_model_info;

/* SPOT_ABI_VERSION of the header the library was built from. */
SPOT_API int spot_abi_version(void);

/* Defaults: verify quick, drafter from the folder, ORT's default threads. */
SPOT_API void spot_open_options_init(spot_open_options* options);
/* Defaults of the Python runtime's DecodeRequest: standard, T 0, seed 0, tau 0.9, 64 new tokens, budget 16,
 * depth 0 (= 8, or the block size if smaller), static mode, no top-k / top-p, the manifest's stop ids. */
SPOT_API void spot_generate_options_init(spot_generate_options* options);

/* Open an exported folder by its manifest.json (files checked against it). `options` may be NULL. On failure *out
 * is NULL and the status says why. */
SPOT_API spot_status spot_open(const char* folder, const spot_open_options* options, spot_model** out,
                               spot_error* err);
/* NULL is fine. Called while a spot_generate runs on the handle — from its on_block, or from another thread once
 * that request is known to be running (e.g. signalled from its on_block) — the request ends after its current
 * block (stats->stopped = 2) and the handle is freed when it returns. A spot_close racing the start of a call on
 * the handle is a use-after-free, like any use of a closed handle. */
SPOT_API void spot_close(spot_model* model);

SPOT_API spot_status spot_model_get_info(const spot_model* model, spot_model_info* info, spot_error* err);

/* Largest number of ids spot_generate may write for this request: max_new_tokens; 0 when spot_generate refuses the
   request for its sizes (max_new_tokens < 1, n_prompt beyond the model's context, or prompt + max_new_tokens, in
   whole blocks, beyond it: spot_model_info.max_context). */
SPOT_API size_t spot_output_capacity(const spot_model* model, size_t n_prompt, int max_new_tokens);

/* Decode `prompt` (n_prompt ids; more than the model's context: SPOT_ERR_INVALID_ARGUMENT). Writes the generated
 * ids after the prompt, cut before the first stop id and at max_new_tokens, to
 * out_ids (capacity out_capacity >= spot_output_capacity(...)) and their number to *out_len. `options` may be NULL
 * (defaults); `stats` may be NULL. On failure *out_len is 0 and *stats all zero. */
SPOT_API spot_status spot_generate(spot_model* model, const int64_t* prompt, size_t n_prompt,
                                   const spot_generate_options* options, int64_t* out_ids, size_t out_capacity,
                                   size_t* out_len, spot_stats* stats, spot_error* err);

/* Streaming: called after each finished block with the ids that block adds to the output (the generated part of
 * the block, cut before a stop id and at max_new_tokens; n_ids may be 0), so the calls' ids joined are what
 * spot_generate_stream writes to
 * out_ids. `ids` is valid during the call only. Return 0 to go on, nonzero to end generation after this block
 * (stats->stopped = 2). Called on the thread that called spot_generate_stream; a call back into the same model is
 * refused (SPOT_ERR_INVALID_ARGUMENT), and (a C function) it must not throw. */
typedef int (*spot_block_callback)(const int64_t* ids, size_t n_ids, void* user_data);

/* spot_generate with a block callback (NULL: exactly spot_generate). Diffusion decoding finalises a block at a
 * time, so this is the finest granularity at which output ids are final. */
SPOT_API spot_status spot_generate_stream(spot_model* model, const int64_t* prompt, size_t n_prompt,
                                          const spot_generate_options* options, spot_block_callback on_block,
                                          void* user_data, int64_t* out_ids, size_t out_capacity, size_t* out_len,
                                          spot_stats* stats, spot_error* err);

/* Several decoders over one opened model. A spot_context decodes like the model handle itself — its own KV cache,
 * one request at a time, a call while its request runs returning SPOT_ERR_INVALID_ARGUMENT — over the model's ONNX
 * Runtime sessions, which the handle and all its contexts share: N contexts hold the weights once, plus N KV caches
 * and the buffers of the passes running at the same time (docs/cpp-host.md).
 * Threads: requests on different decoders (the model handle and each context) may run at the same time on
 * different threads: ONNX Runtime's Run is thread-safe and nothing else they share changes. spot_context_open may
 * run while other decoders of the model decode; it must not race spot_close of the model. Closing: contexts and
 * the model handle close in any order (spot_context_close: as spot_close, a close during the context's request takes
 * effect when it returns); the weights are released with the last of them. spot_model_get_info and
 * spot_output_capacity, which read the model handle, hold for its contexts. */
typedef struct spot_context spot_context; /* opaque */

/* A new decoder over `model`: no file is read and no session made. On failure *out is NULL. */
SPOT_API spot_status spot_context_open(spot_model* model, spot_context** out, spot_error* err);
/* NULL is fine. */
SPOT_API void spot_context_close(spot_context* context);
/* spot_generate / spot_generate_stream on the context's own KV cache. */
SPOT_API spot_status spot_context_generate(spot_context* context, const int64_t* prompt, size_t n_prompt,
                                           const spot_generate_options* options, int64_t* out_ids,
                                           size_t out_capacity, size_t* out_len, spot_stats* stats, spot_error* err);
SPOT_API spot_status spot_context_generate_stream(spot_context* context, const int64_t* prompt, size_t n_prompt,
                                                  const spot_generate_options* options, spot_block_callback on_block,
                                                  void* user_data, int64_t* out_ids, size_t out_capacity,
                                                  size_t* out_len, spot_stats* stats, spot_error* err);

/* The noise of docs/noise.md: Gumbel(0, 1) as a pure function of five uint32 counters (exported for tests). */
SPOT_API double spot_gumbel(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, uint32_t token);
/* Its uniform in (0, 1), with the two hash words a and b. */
SPOT_API double spot_uniform(uint32_t seed, uint32_t block, uint32_t step, uint32_t position, uint32_t token,
                             uint32_t* a, uint32_t* b);

/* A static string: the decoder's name, "unknown" for a value outside the enum. */
SPOT_API const char* spot_decoder_name(spot_decoder decoder);
/* Parse "standard", "threshold", "chain", "tree", "spot", "spot-sets"; "oracle" / "order-oracle" (Python-only
   diagnostics): SPOT_ERR_UNSUPPORTED; anything else: SPOT_ERR_INVALID_ARGUMENT. */
SPOT_API spot_status spot_decoder_from_name(const char* name, spot_decoder* out, spot_error* err);

#ifdef __cplusplus
}
#endif

#endif /* SPOT_SPOT_H */
