// spot_cli: the example program of the C++ host, using only the C API of include/spot/spot.h.
//
//   spot_cli generate --model DIR|NAME [--drafter DIR] [--decoder NAME] --prompt-ids 1,2,3 [--temperature T]
//                     [--seed S] [--tau X] [--max-new-tokens N] [--budget N] [--depth D] [--mode static|threshold]
//                     [--top-k K] [--top-p P] [--stop-ids a,b] [--threads N] [--verify quick|full|none]
//                     [--store fused|separate]
//                     [--device cpu|cuda|trt] [--sampler auto|host|device] [--kv-cache auto|host|device]
//       -> one JSON line: token ids, pass counts by kind, steps, host milliseconds
//   spot_cli batch --model DIR [--drafter DIR] [--threads N] [--verify ...] [--device ...] [--sampler ...]
//                  [--kv-cache ...] [--contexts N] < requests
//       -> one JSON line per stdin line; a line holds the generate flags of one request (no --model / --drafter);
//          the model is opened once. A failed request prints {"error": {...}} and the batch goes on. --contexts N:
//          N decoders over the one opened model (the handle and N - 1 spot_contexts: the weights once) decode the
//          requests at the same time, request i on decoder i mod N, each on its own thread; the lines keep the
//          requests' order.
//   spot_cli info --model DIR [--drafter DIR]
//   spot_cli noise < lines "seed block step position token"  -> "a b u g" (hex words, C99 hex floats)
//
// --model takes an exported folder, or an embedded model's name (arithmetic, code; embedded = code): the export
// `spot demo` caches in $SPOT_CACHE (else ~/.cache/spot) as NAME-fp32-onnx, as the Python CLI resolves it.
//
// Exit status: 0 success; the spot_status code (1..7) of the first failure, with "spot_cli: error ..." on stderr;
// 64 for a usage error.
#include <cerrno>
#include <cinttypes>
#include <functional>
#include <thread>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "spot/spot.h"

namespace {

constexpr int kUsageExit = 64;

const char* kUsage =
    "usage: spot_cli generate --model DIR|NAME [--drafter DIR]\n"
    "                         [--decoder standard|threshold|chain|tree|spot|spot-sets]\n"
    "                         --prompt-ids IDS [--temperature T] [--seed S] [--tau X] [--max-new-tokens N (128)]\n"
    "                         [--budget N] [--depth D] [--mode static|threshold] [--top-k K] [--top-p P]\n"
    "                         [--store fused|separate]\n"
    "                         [--stop-ids IDS] [--threads N] [--verify quick|full|none] [--device cpu|cuda|trt]\n"
    "                         [--sampler auto|host|device] [--kv-cache auto|host|device]\n"
    "                         [--stream N]   (JSON line per final block; N > 0: stop after N blocks)\n"
    "       spot_cli batch --model DIR [--drafter DIR] [--threads N] [--verify ...] [--device ...] [--sampler ...]\n"
    "                      [--kv-cache ...] [--contexts N] < requests (one per line; blank lines are skipped)\n"
    "       spot_cli info --model DIR [--drafter DIR] [--device ...] [--sampler ...] [--kv-cache ...]\n"
    "       spot_cli noise < lines 'seed block step position token'\n";

struct UsageError {
  std::string message;
};

const char* status_name(spot_status s) {
  switch (s) {
    case SPOT_OK: return "ok";
    case SPOT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case SPOT_ERR_NOT_FOUND: return "not found";
    case SPOT_ERR_CORRUPT: return "corrupt";
    case SPOT_ERR_INCOMPATIBLE: return "incompatible";
    case SPOT_ERR_UNSUPPORTED: return "unsupported";
    case SPOT_ERR_RUNTIME: return "runtime";
    case SPOT_ERR_INTERNAL: return "internal";
  }
  return "unknown";
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

int64_t parse_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) throw UsageError{flag + " expects an integer, got '" + v + "'"};
  return x;
}

// A flag whose C API field is an int: a value outside int's range is a usage error, not a silent wrap.
int parse_int32(const std::string& flag, const std::string& v) {
  const int64_t x = parse_int(flag, v);
  if (x < INT_MIN || x > INT_MAX)
    throw UsageError{flag + " expects an integer in [" + std::to_string(INT_MIN) + ", " + std::to_string(INT_MAX) +
                     "], got " + v};
  return static_cast<int>(x);
}

double parse_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw UsageError{flag + " expects a number, got '" + v + "'"};
  // strtod rounds a value below the smallest double to 0: --temperature 1e-400 would decode greedily
  if (errno == ERANGE && x == 0.0) throw UsageError{flag + " " + v + " is too small for a double (it rounds to 0)"};
  return x;
}

std::string trimmed(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t"), last = s.find_last_not_of(" \t");
  return first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
}

std::vector<int64_t> parse_ids(const std::string& flag, const std::string& v) {
  std::vector<int64_t> ids;
  // '' or "": an empty list, as a shell passes it to generate and as a batch line (split on whitespace) writes it
  if (trimmed(v).empty() || v == "''" || v == "\"\"") return ids;
  if (v.back() == ',') throw UsageError{flag + " expects comma-separated integers, got a trailing comma in '" + v + "'"};
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) ids.push_back(parse_int(flag, trimmed(item)));   // "1, 2" as Python reads it
  return ids;
}

struct OpenArgs {
  std::string model, drafter;
  spot_open_options options;
  int64_t contexts = 1;   // batch --contexts: decoders over the opened model
};

// Where a request's output lines go: stdout at once (one decoder), or its own buffer, printed in the requests'
// order once every decoder is done (--contexts N).
using Sink = std::function<void(const std::string&)>;

void print_line(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
}

// One decoder of the opened model: the handle itself, or a context over it.
struct Decoder {
  spot_model* model;
  spot_context* context;   // null: the model handle's own
};

constexpr int kDefaultMaxNewTokens = 128;   // spot generate's default (the C API's is DecodeRequest's 64)

struct Request {
  Request() {
    spot_generate_options_init(&options);
    options.max_new_tokens = kDefaultMaxNewTokens;
  }
  spot_generate_options options;
  std::vector<int64_t> prompt, stop_ids;
  bool has_stop_ids = false;
  bool has_prompt = false;   // --prompt-ids given (an empty list is a choice; no flag is a mistake)
  int64_t stream = -1;   // --stream N: -1 off; print each final block's ids; N > 0: stop after N blocks
  bool depth_zero = false;   // --depth 0: the C API reads 0 as "the default depth"; as a flag it is out of range
};

// The streaming callback of --stream: one JSON line per finished block, and the request's block limit (a user
// interface would stop here when its user asks it to).
struct StreamState {
  int64_t limit;
  const Sink* out;
  int64_t seen = 0;
};

int print_block(const int64_t* ids, size_t n, void* user) {
  auto* state = static_cast<StreamState*>(user);
  std::string line = "{\"block_ids\": [";
  for (size_t i = 0; i < n; ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
  (*state->out)(line + "]}\n");
  return state->limit > 0 && ++state->seen >= state->limit;
}

// Parses flags into open args and / or a request; a NULL target makes its flags illegal here.
void parse_flags(const std::vector<std::string>& args, size_t start, OpenArgs* open, Request* req) {
  for (size_t i = start; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag.rfind("--", 0) != 0) throw UsageError{"expected --flag value pairs, got '" + flag + "'"};
    if (i + 1 >= args.size()) throw UsageError{flag + " needs a value"};
    const std::string& v = args[++i];
    if (open && flag == "--model") open->model = v;
    else if (open && flag == "--contexts") {
      open->contexts = parse_int(flag, v);
      if (open->contexts < 1 || open->contexts > 256) throw UsageError{"--contexts expects 1..256, got " + v};
    }
    else if (open && flag == "--drafter") open->drafter = v;
    else if (open && flag == "--threads") open->options.threads = parse_int32(flag, v);
    else if (open && flag == "--verify") {
      if (v == "quick") open->options.verify = SPOT_VERIFY_QUICK;
      else if (v == "full") open->options.verify = SPOT_VERIFY_FULL;
      else if (v == "none") open->options.verify = SPOT_VERIFY_NONE;
      else throw UsageError{"--verify expects quick, full or none"};
    } else if (open && flag == "--device") {   // spot generate's --device names
      if (v == "cpu") open->options.device = SPOT_DEVICE_CPU;
      else if (v == "cuda") open->options.device = SPOT_DEVICE_CUDA;
      else if (v == "trt") open->options.device = SPOT_DEVICE_TENSORRT;
      else throw UsageError{"--device expects cpu, cuda or trt, got " + v};
    } else if (open && flag == "--sampler") {
      if (v == "auto") open->options.sampler = SPOT_SAMPLER_AUTO;
      else if (v == "host") open->options.sampler = SPOT_SAMPLER_HOST;
      else if (v == "device") open->options.sampler = SPOT_SAMPLER_DEVICE;
      else throw UsageError{"--sampler expects auto, host or device, got " + v};
    } else if (open && flag == "--kv-cache") {
      if (v == "auto") open->options.kv_cache = SPOT_KV_CACHE_AUTO;
      else if (v == "host") open->options.kv_cache = SPOT_KV_CACHE_HOST;
      else if (v == "device") open->options.kv_cache = SPOT_KV_CACHE_DEVICE;
      else throw UsageError{"--kv-cache expects auto, host or device, got " + v};
    } else if (req && flag == "--decoder") {
      spot_error err;
      spot_status st = spot_decoder_from_name(v.c_str(), &req->options.decoder, &err);
      if (st != SPOT_OK) throw UsageError{err.message};
    } else if (req && flag == "--prompt-ids") {
      req->prompt = parse_ids(flag, v);
      req->has_prompt = true;
    }
    else if (req && flag == "--temperature") req->options.temperature = parse_double(flag, v);
    else if (req && flag == "--seed") {
      int64_t s = parse_int(flag, v);
      if (s < 0 || s > 0xFFFFFFFFll) throw UsageError{"--seed must be in [0, 2**32), got " + v};
      req->options.seed = static_cast<uint32_t>(s);
    } else if (req && flag == "--tau") req->options.tau = parse_double(flag, v);
    else if (req && flag == "--max-new-tokens") req->options.max_new_tokens = parse_int32(flag, v);
    else if (req && flag == "--budget") req->options.budget = parse_int32(flag, v);
    else if (req && flag == "--depth") {
      req->options.depth = parse_int32(flag, v);
      req->depth_zero = req->options.depth == 0;
    }
    else if (req && flag == "--top-k") req->options.top_k = parse_int32(flag, v);
    else if (req && flag == "--top-p") req->options.top_p = parse_double(flag, v);
    else if (req && flag == "--mode") {
      if (v == "static") req->options.mode = SPOT_MODE_STATIC;
      else if (v == "threshold") req->options.mode = SPOT_MODE_THRESHOLD;
      else throw UsageError{"--mode expects static or threshold"};
    } else if (req && flag == "--store") {
      if (v == "fused") req->options.store_mode = SPOT_STORE_FUSED;
      else if (v == "separate") req->options.store_mode = SPOT_STORE_SEPARATE;
      else throw UsageError{"--store expects fused or separate"};
    } else if (req && flag == "--stream") {
      req->stream = parse_int(flag, v);
      if (req->stream < 0) throw UsageError{"--stream expects N >= 0 (0: to the end), got " + v};
    } else if (req && flag == "--stop-ids") {
      req->stop_ids = parse_ids(flag, v);
      req->has_stop_ids = true;
    } else {
      throw UsageError{"unknown flag " + flag};
    }
  }
}

std::string error_json(spot_status st, const char* message) {
  return "{\"error\": {\"code\": " + std::to_string(static_cast<int>(st)) + ", \"name\": \"" + status_name(st) +
         "\", \"message\": \"" + json_escape(message) + "\"}}\n";
}

void print_error_json(spot_status st, const char* message) { print_line(error_json(st, message)); }

std::string result_json(const spot_generate_options& o, const std::vector<int64_t>& ids, const spot_stats& s) {
  std::string out = "{\"decoder\": \"";
  out += spot_decoder_name(o.decoder);
  out += "\", \"token_ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  out += "]";
  // the commit rule the request decoded with, as the Python CLI's "mode" (threshold / spot-sets: always threshold)
  const bool threshold = o.decoder == SPOT_DECODER_THRESHOLD || o.decoder == SPOT_DECODER_SPOT_SETS ||
                         o.mode == SPOT_MODE_THRESHOLD;
  out += threshold ? ", \"mode\": \"threshold\"" : ", \"mode\": \"static\"";
  char buf[640];
  std::snprintf(buf, sizeof(buf),
                ", \"stopped\": %s, \"cancelled\": %s, \"target_passes\": %" PRId64 ", \"passes\": {\"prefill\": %" PRId64
                ", \"block\": %" PRId64 ", \"verify\": %" PRId64 ", \"store\": %" PRId64 ", \"fused\": %" PRId64
                "}, \"steps\": %" PRId64
                ", \"blocks\": %" PRId64 ", \"seconds\": %.6f, \"draft_ms\": %.6f, \"walk_ms\": %.6f, "
                "\"target_ms\": %.6f, \"epilogue_states\": %" PRId64 ", \"epilogue_ms\": %.6f}",
                s.stopped == 1 ? "true" : "false", s.stopped == 2 ? "true" : "false", s.target_passes, s.prefill_passes, s.block_passes, s.verify_passes,
                s.store_passes, s.fused_passes, s.steps, s.blocks, s.seconds, s.draft_ms, s.walk_ms, s.target_ms, s.epilogue_states,
                s.epilogue_ms);
  out += buf;
  return out + "\n";
}

void require_prompt(const Request& req) {
  if (!req.has_prompt) throw UsageError{"--prompt-ids is required (--prompt-ids '' for an empty prompt)"};
}

spot_status run_request(const Decoder& decoder, Request& req, const Sink& out) {
  spot_model* model = decoder.model;
  if (req.has_stop_ids) {
    // none: a pointer with n_stop_ids 0 — an empty vector's data() may be NULL, which means "the manifest's"
    static const int64_t kNoStopIds = 0;
    req.options.stop_ids = req.stop_ids.empty() ? &kNoStopIds : req.stop_ids.data();
    req.options.n_stop_ids = req.stop_ids.size();
  }
  size_t cap = spot_output_capacity(model, req.prompt.size(), req.options.max_new_tokens);
  std::vector<int64_t> ids(cap > 0 ? cap : 1);
  size_t n = 0;
  spot_stats stats;
  spot_error err;
  StreamState stream{req.stream, &out};
  const spot_decoder d = req.options.decoder;
  if (req.depth_zero && d != SPOT_DECODER_STANDARD && d != SPOT_DECODER_THRESHOLD) {
    // refused as the C API refuses any other depth out of range (and as Python refuses 0); the baseline decoders
    // have no depth and ignore it, as in Python
    spot_model_info info;
    spot_model_get_info(model, &info, nullptr);
    const std::string message = "depth must be in 1.." + std::to_string(info.block_size) + " (the block size), got 0";
    out(error_json(SPOT_ERR_INVALID_ARGUMENT, message.c_str()));
    std::fprintf(stderr, "spot_cli: error (code %d, %s): %s\n", static_cast<int>(SPOT_ERR_INVALID_ARGUMENT),
                 status_name(SPOT_ERR_INVALID_ARGUMENT), message.c_str());
    return SPOT_ERR_INVALID_ARGUMENT;
  }
  spot_block_callback on_block = req.stream >= 0 ? print_block : nullptr;
  spot_status st =
      decoder.context != nullptr
          ? spot_context_generate_stream(decoder.context, req.prompt.data(), req.prompt.size(), &req.options,
                                         on_block, &stream, ids.data(), ids.size(), &n, &stats, &err)
          : spot_generate_stream(model, req.prompt.data(), req.prompt.size(), &req.options, on_block, &stream,
                                 ids.data(), ids.size(), &n, &stats, &err);
  if (st != SPOT_OK) {
    out(error_json(st, err.message));
    std::fprintf(stderr, "spot_cli: error (code %d, %s): %s\n", static_cast<int>(st), status_name(st), err.message);
    return st;
  }
  ids.resize(n);
  out(result_json(req.options, ids, stats));
  return SPOT_OK;
}

// spot.assets.MODELS / ALIASES and spot.demo.embedded_export_dir: an embedded model's name -> its cached export
// (a name wins over a folder of that name in the current directory: write ./code for the folder)
std::string resolve_model(const std::string& model) {
  const std::string name = model == "embedded" ? "code" : model;
  if (name != "arithmetic" && name != "code") return model;       // spot_open names the missing folder
  const char* env = std::getenv("SPOT_CACHE");
  const char* home = std::getenv("HOME");
  std::filesystem::path cache = env && *env ? std::filesystem::path(env)
                                            : std::filesystem::path(home && *home ? home : ".") / ".cache" / "spot";
  std::filesystem::path folder = cache / (name + "-fp32-onnx");
  if (!std::filesystem::is_directory(folder))
    throw UsageError{"--model " + model + " names the embedded " + name + " model, whose export " + folder.string() +
                     " does not exist yet: run `spot demo --model " + name + "` once (or `spot-export " + name +
                     " --out DIR` and pass --model DIR)"};
  return folder.string();
}

spot_model* open_model(const OpenArgs& a, spot_status* st) {
  if (a.model.empty()) throw UsageError{"--model is required"};
  const std::string folder = resolve_model(a.model);
  spot_open_options o = a.options;
  o.drafter_dir = a.drafter.empty() ? nullptr : a.drafter.c_str();
  spot_model* model = nullptr;
  spot_error err;
  *st = spot_open(folder.c_str(), &o, &model, &err);
  if (*st != SPOT_OK) {
    print_error_json(*st, err.message);
    std::fprintf(stderr, "spot_cli: error (code %d, %s): %s\n", static_cast<int>(*st), status_name(*st),
                 err.message);
  }
  return model;
}

std::vector<std::string> split_ws(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string w;
  while (ss >> w) out.push_back(w);
  return out;
}

int cmd_noise() {
  const char* kShape = "noise reads lines of five integers 'seed block step position token'";
  std::string line;
  while (std::getline(std::cin, line)) {
    const std::vector<std::string> words = split_ws(line);
    if (words.empty()) continue;
    if (words.size() != 5) throw UsageError{std::string(kShape) + ", got '" + line + "'"};
    uint32_t c[5];
    for (int i = 0; i < 5; ++i) {
      const int64_t v = parse_int("noise", words[i]);
      if (v < 0 || v > 0xFFFFFFFFll) throw UsageError{"noise counters must be in [0, 2**32)"};
      c[i] = uint32_t(v);
    }
    uint32_t a = 0, b = 0;
    double u = spot_uniform(c[0], c[1], c[2], c[3], c[4], &a, &b);
    double g = spot_gumbel(c[0], c[1], c[2], c[3], c[4]);
    std::printf("%08x %08x %a %a\n", a, b, u, g);
  }
  return 0;
}

// A batch line's request; false (its error printed through `out`) when the line is not one.
bool parse_request(const std::string& line, Request* req, const Sink& out) {
  try {
    parse_flags(split_ws(line), 0, nullptr, req);
    require_prompt(*req);
  } catch (const UsageError& e) {
    out(error_json(SPOT_ERR_INVALID_ARGUMENT, e.message.c_str()));
    return false;
  }
  return true;
}

// The requests of stdin in turn on the model handle, each line printed when it is decoded; the exit status.
int cmd_batch(spot_model* model) {
  int first_failure = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (split_ws(line).empty()) continue;
    Request req;
    if (!parse_request(line, &req, print_line)) {
      if (!first_failure) first_failure = kUsageExit;
      continue;
    }
    const spot_status st = run_request({model, nullptr}, req, print_line);
    if (st != SPOT_OK && !first_failure) first_failure = st;
  }
  return first_failure;
}

// --contexts N: the requests of stdin on N decoders at once (the handle and N - 1 contexts over it), request i on
// decoder i mod N; each request's lines are kept and printed in the requests' order at the end; the exit status.
int cmd_batch_concurrent(spot_model* model, int64_t contexts) {
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(std::cin, line))
    if (!split_ws(line).empty()) lines.push_back(line);
  std::vector<Decoder> decoders = {{model, nullptr}};
  for (int64_t i = 1; i < contexts; ++i) {
    spot_context* context = nullptr;
    spot_error err;
    const spot_status st = spot_context_open(model, &context, &err);
    if (st != SPOT_OK) {
      print_error_json(st, err.message);
      for (const Decoder& d : decoders) spot_context_close(d.context);
      return st;
    }
    decoders.push_back({model, context});
  }
  std::vector<std::string> outputs(lines.size());
  std::vector<int> statuses(lines.size(), 0);
  std::vector<std::thread> threads;
  for (size_t d = 0; d < decoders.size(); ++d)
    threads.emplace_back([&, d]() {
      for (size_t i = d; i < lines.size(); i += decoders.size()) {
        const Sink out = [&outputs, i](const std::string& text) { outputs[i] += text; };
        Request req;
        statuses[i] = parse_request(lines[i], &req, out) ? run_request(decoders[d], req, out) : kUsageExit;
      }
    });
  for (std::thread& t : threads) t.join();
  for (const Decoder& d : decoders) spot_context_close(d.context);
  int first_failure = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    print_line(outputs[i]);
    if (statuses[i] != 0 && !first_failure) first_failure = statuses[i];
  }
  return first_failure;
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2) throw UsageError{"a command is required"};
  const std::string& cmd = args[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "noise") return cmd_noise();
  OpenArgs oa;
  spot_open_options_init(&oa.options);
  if (cmd == "generate") {
    Request req;
    parse_flags(args, 2, &oa, &req);
    require_prompt(req);
    spot_status st;
    spot_model* model = open_model(oa, &st);
    if (model == nullptr) return st;
    st = run_request({model, nullptr}, req, print_line);
    spot_close(model);
    return st;
  }
  if (cmd == "batch") {
    parse_flags(args, 2, &oa, nullptr);
    spot_status st;
    spot_model* model = open_model(oa, &st);
    if (model == nullptr) return st;
    const int first_failure = oa.contexts > 1 ? cmd_batch_concurrent(model, oa.contexts) : cmd_batch(model);
    spot_close(model);
    return first_failure;
  }
  if (cmd == "info") {
    parse_flags(args, 2, &oa, nullptr);
    spot_status st;
    spot_model* model = open_model(oa, &st);
    if (model == nullptr) return st;
    spot_model_info info;
    spot_error err;
    spot_model_get_info(model, &info, &err);
    std::printf("{\"vocab_size\": %" PRId64 ", \"block_size\": %" PRId64 ", \"mask_token_id\": %" PRId64
                ", \"max_nodes\": %" PRId64 ", \"max_context\": %" PRId64
                ", \"has_drafter\": %s, \"dtype\": \"%s\", \"ort_version\": \"%s\", \"spot_version\": \"%s\""
                ", \"abi_version\": %d, \"samples_on_device\": %s, \"cache_on_device\": %s}\n",
                info.vocab_size, info.block_size, info.mask_token_id, info.max_nodes, info.max_context,
                info.has_drafter ? "true" : "false", info.dtype, info.ort_version, SPOT_VERSION, spot_abi_version(),
                info.samples_on_device ? "true" : "false", info.cache_on_device ? "true" : "false");
    spot_close(model);
    return 0;
  }
  throw UsageError{"unknown command '" + cmd + "'"};
}

}  // namespace

int main(int argc, char** argv) {
  if (spot_abi_version() != SPOT_ABI_VERSION) {   // a libspot built from another header: its structs differ
    std::fprintf(stderr, "spot_cli: error (incompatible): libspot has binary interface %d, this program was built "
                 "for %d\n", spot_abi_version(), SPOT_ABI_VERSION);
    return SPOT_ERR_INCOMPATIBLE;
  }
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "spot_cli: usage error: %s\n%s", e.message.c_str(), kUsage);
    return kUsageExit;
  }
}
