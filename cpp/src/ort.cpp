#include "ort.h"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <system_error>

#include "errors.h"

namespace spot {
namespace {

const OrtApi* g_api = nullptr;
OrtEnv* g_env = nullptr;
std::once_flag g_once;
std::string g_init_error;

void init_runtime() {
  const OrtApiBase* base = OrtGetApiBase();
  if (base == nullptr) {
    g_init_error = "OrtGetApiBase() returned NULL";
    return;
  }
  g_api = base->GetApi(ORT_API_VERSION);
  if (g_api == nullptr) {
    g_init_error = std::string("the ONNX Runtime library (") + base->GetVersionString() +
                   ") does not serve C API version " + std::to_string(ORT_API_VERSION) +
                   " of the headers this host was built with: link a newer libonnxruntime";
    return;
  }
  // the environment lives for the whole process: ORT allows one, and releasing it at exit races other statics
  OrtStatus* st = g_api->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "spot", &g_env);
  if (st != nullptr) {
    g_init_error = std::string("cannot create the ONNX Runtime environment: ") + g_api->GetErrorMessage(st);
    g_api->ReleaseStatus(st);
    g_api = nullptr;
  }
}

// A failed status's message, the status released.
std::string take_message(OrtStatus* st) {
  std::string msg = ort_api().GetErrorMessage(st);
  ort_api().ReleaseStatus(st);
  return msg;
}

void check(OrtStatus* st, const std::string& what) {
  if (st != nullptr) fail(SPOT_ERR_RUNTIME, what + ": " + take_message(st));
}

// A provider the library lacks is the user's setup, not a failure of ONNX Runtime: say which library to link.
void require_provider(const std::string& provider, const std::string& device) {
  const std::vector<std::string> have = available_providers();
  if (std::find(have.begin(), have.end(), provider) != have.end()) return;
  std::string offered;
  for (const auto& p : have) offered += (offered.empty() ? "" : ", ") + p;
  fail(SPOT_ERR_UNSUPPORTED, "device " + device + " needs ONNX Runtime's " + provider + "; the linked library " +
                                 ort_version() + " offers " + offered + ": build the host against an " +
                                 "onnxruntime-gpu library (ORT_LIB=/path/to/libonnxruntime.so " +
                                 "cpp/fetch_ort_headers.sh; on Jetson, JetPack's onnxruntime), or use device cpu");
}

// A provider the library has but whose CUDA / cuDNN / TensorRT libraries did not load.
void check_provider(OrtStatus* st, const std::string& provider) {
  if (st == nullptr) return;
  fail(SPOT_ERR_RUNTIME, provider + " did not load (are the CUDA, cuDNN and TensorRT libraries it was built " +
                             "for on the library path?): " + take_message(st).substr(0, 400));
}

void append_cuda(OrtSessionOptions* so, const SessionConfig& cfg) {
  const OrtApi& api = ort_api();
  OrtCUDAProviderOptionsV2* opts = nullptr;
  check_provider(api.CreateCUDAProviderOptions(&opts), "CUDAExecutionProvider");
  OrtStatus* st = nullptr;
  if (cfg.cuda_exact_arena) {
    const char* keys[] = {"arena_extend_strategy"};
    const char* values[] = {"kSameAsRequested"};
    st = api.UpdateCUDAProviderOptions(opts, keys, values, 1);
  }
  if (st == nullptr) st = api.SessionOptionsAppendExecutionProvider_CUDA_V2(so, opts);
  api.ReleaseCUDAProviderOptions(opts);
  check_provider(st, "CUDAExecutionProvider");
}

// The Python runtime's TensorRT options (ort_sessions.trt_options): engine and timing caches outside the exported
// folder, fp16 for an fp16 export, the export's shape profile (one engine build for every pass).
void append_tensorrt(OrtSessionOptions* so, const SessionConfig& cfg) {
  const OrtApi& api = ort_api();
  std::error_code ec;
  std::filesystem::create_directories(cfg.trt_cache_dir, ec);
  if (ec)
    fail(SPOT_ERR_RUNTIME, "cannot create the TensorRT engine cache " + cfg.trt_cache_dir + " (" + ec.message() +
                               "): set SPOT_CACHE to a writable folder");
  OrtTensorRTProviderOptionsV2* opts = nullptr;
  check_provider(api.CreateTensorRTProviderOptions(&opts), "TensorrtExecutionProvider");
  std::vector<const char*> keys = {"trt_engine_cache_enable", "trt_engine_cache_path", "trt_timing_cache_enable",
                                   "trt_timing_cache_path", "trt_fp16_enable"};
  std::vector<const char*> values = {"1", cfg.trt_cache_dir.c_str(), "1", cfg.trt_cache_dir.c_str(),
                                     cfg.trt_fp16 ? "1" : "0"};
  if (!cfg.trt_profile_min.empty()) {
    keys.insert(keys.end(), {"trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes"});
    values.insert(values.end(), {cfg.trt_profile_min.c_str(), cfg.trt_profile_opt.c_str(),
                                 cfg.trt_profile_max.c_str()});
  }
  OrtStatus* st = api.UpdateTensorRTProviderOptions(opts, keys.data(), values.data(), keys.size());
  if (st == nullptr) st = api.SessionOptionsAppendExecutionProvider_TensorRT_V2(so, opts);
  api.ReleaseTensorRTProviderOptions(opts);
  check_provider(st, "TensorrtExecutionProvider");
}

void append_providers(OrtSessionOptions* so, const SessionConfig& cfg) {
  if (cfg.device == Device::kCpu) return;     // the CPU provider is always there
  require_provider("CUDAExecutionProvider", cfg.device == Device::kCuda ? "cuda" : "trt");
  if (cfg.device == Device::kTensorRT) {
    require_provider("TensorrtExecutionProvider", "trt");
    append_tensorrt(so, cfg);
  }
  append_cuda(so, cfg);
}

std::vector<std::string> io_names(OrtSession* s, bool inputs) {
  const OrtApi& api = ort_api();
  OrtAllocator* alloc = nullptr;
  check(api.GetAllocatorWithDefaultOptions(&alloc), "GetAllocatorWithDefaultOptions");
  size_t n = 0;
  check(inputs ? api.SessionGetInputCount(s, &n) : api.SessionGetOutputCount(s, &n), "SessionGet*Count");
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    char* name = nullptr;
    check(inputs ? api.SessionGetInputName(s, i, alloc, &name) : api.SessionGetOutputName(s, i, alloc, &name),
          "SessionGet*Name");
    out.emplace_back(name);
    check(api.AllocatorFree(alloc, name), "AllocatorFree");
  }
  return out;
}

}  // namespace

const OrtApi& ort_api() {
  std::call_once(g_once, init_runtime);
  if (g_api == nullptr) fail(SPOT_ERR_RUNTIME, g_init_error);
  return *g_api;
}

std::string ort_version() { return OrtGetApiBase()->GetVersionString(); }

OrtOutput::~OrtOutput() {
  if (v_ != nullptr) ort_api().ReleaseValue(v_);
}

OrtOutput& OrtOutput::operator=(OrtOutput&& o) noexcept {
  if (this != &o) {
    if (v_ != nullptr) ort_api().ReleaseValue(v_);
    v_ = o.v_;
    o.v_ = nullptr;
  }
  return *this;
}

std::vector<int64_t> OrtOutput::shape() const {
  const OrtApi& api = ort_api();
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api.GetTensorTypeAndShape(v_, &info), "GetTensorTypeAndShape");
  size_t n = 0;
  OrtStatus* st = api.GetDimensionsCount(info, &n);
  std::vector<int64_t> dims(n);
  if (st == nullptr) st = api.GetDimensions(info, dims.data(), n);
  api.ReleaseTensorTypeAndShapeInfo(info);
  check(st, "GetDimensions");
  return dims;
}

ONNXTensorElementDataType OrtOutput::type() const {
  const OrtApi& api = ort_api();
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api.GetTensorTypeAndShape(v_, &info), "GetTensorTypeAndShape");
  ONNXTensorElementDataType t = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  OrtStatus* st = api.GetTensorElementType(info, &t);
  api.ReleaseTensorTypeAndShapeInfo(info);
  check(st, "GetTensorElementType");
  return t;
}

const void* OrtOutput::data() const {
  void* p = nullptr;
  check(ort_api().GetTensorMutableData(v_, &p), "GetTensorMutableData");
  return p;
}

OrtOutput OrtOutput::view(size_t first, std::vector<int64_t> shape) const {
  size_t have = 1, want = 1;
  for (int64_t d : this->shape()) have *= static_cast<size_t>(d);
  for (int64_t d : shape) want *= static_cast<size_t>(d);
  const ONNXTensorElementDataType t = type();
  const size_t elem = t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? 4 : t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? 2 : 0;
  if (elem == 0 || first + want > have)
    fail(SPOT_ERR_INTERNAL, "view: elements [" + std::to_string(first) + ", " + std::to_string(first + want) +
                                ") of a float / float16 tensor of " + std::to_string(have));
  const OrtApi& api = ort_api();
  const OrtMemoryInfo* where = nullptr;
  check(api.GetTensorMemoryInfo(v_, &where), "GetTensorMemoryInfo");
  uint8_t* base = static_cast<uint8_t*>(const_cast<void*>(data()));
  OrtValue* view = nullptr;
  check(api.CreateTensorWithDataAsOrtValue(where, base + first * elem, want * elem, shape.data(), shape.size(), t,
                                           &view),
        "CreateTensorWithDataAsOrtValue");
  return OrtOutput(view);
}

OrtSessionHandle::OrtSessionHandle(const std::string& path, const SessionConfig& cfg) : path_(path) {
  const OrtApi& api = ort_api();
  OrtSessionOptions* so = nullptr;
  check(api.CreateSessionOptions(&so), "CreateSessionOptions");
  try {
    append_providers(so, cfg);
  } catch (...) {
    api.ReleaseSessionOptions(so);
    throw;
  }
  OrtStatus* st = api.SetSessionGraphOptimizationLevel(so, ORT_ENABLE_ALL);
  if (st == nullptr) st = api.SetSessionLogSeverityLevel(so, 3);
  if (st == nullptr && cfg.intra_threads > 0) st = api.SetIntraOpNumThreads(so, cfg.intra_threads);
  if (st == nullptr && cfg.single_inter_thread) st = api.SetInterOpNumThreads(so, 1);
  for (const auto& [key, value] : cfg.config_entries)
    if (st == nullptr) st = api.AddSessionConfigEntry(so, key.c_str(), value.c_str());
  if (st == nullptr) st = api.CreateSession(g_env, path.c_str(), so, &session_);
  api.ReleaseSessionOptions(so);
  if (st != nullptr)
    fail(SPOT_ERR_RUNTIME, "onnxruntime could not load " + path + ": " + take_message(st).substr(0, 400));
  try {
    check(api.CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &mem_), "CreateCpuMemoryInfo");
    inputs_ = io_names(session_, true);
    outputs_ = io_names(session_, false);
  } catch (...) {
    if (mem_) api.ReleaseMemoryInfo(mem_);
    api.ReleaseSession(session_);
    throw;
  }
}

OrtSessionHandle::Declared OrtSessionHandle::declared(const std::string& name) const {
  const OrtApi& api = ort_api();
  Declared out;
  for (int io = 0; io < 2 && !out.found; ++io) {
    const std::vector<std::string>& names = io == 0 ? inputs_ : outputs_;
    const auto at = std::find(names.begin(), names.end(), name);
    if (at == names.end()) continue;
    const size_t i = static_cast<size_t>(at - names.begin());
    OrtTypeInfo* info = nullptr;
    check(io == 0 ? api.SessionGetInputTypeInfo(session_, i, &info) : api.SessionGetOutputTypeInfo(session_, i, &info),
          "SessionGet*TypeInfo");
    const OrtTensorTypeAndShapeInfo* tensor = nullptr;   // owned by info
    OrtStatus* st = api.CastTypeInfoToTensorInfo(info, &tensor);
    size_t n = 0;
    if (st == nullptr && tensor != nullptr) st = api.GetTensorElementType(tensor, &out.type);
    if (st == nullptr && tensor != nullptr) st = api.GetDimensionsCount(tensor, &n);
    out.dims.resize(n);
    if (st == nullptr && tensor != nullptr) st = api.GetDimensions(tensor, out.dims.data(), n);
    api.ReleaseTypeInfo(info);
    check(st, "GetTensorTypeAndShape");
    out.found = tensor != nullptr;
  }
  return out;
}

std::vector<std::string> available_providers() {
  const OrtApi& api = ort_api();
  char** names = nullptr;
  int n = 0;
  check(api.GetAvailableProviders(&names, &n), "GetAvailableProviders");
  std::vector<std::string> out(names, names + n);
  check(api.ReleaseAvailableProviders(names, n), "ReleaseAvailableProviders");
  return out;
}

OrtSessionHandle::~OrtSessionHandle() {
  if (mem_) ort_api().ReleaseMemoryInfo(mem_);
  if (session_) ort_api().ReleaseSession(session_);
}

std::vector<OrtValue*> OrtSessionHandle::host_values(const std::vector<InputTensor>& inputs) const {
  const OrtApi& api = ort_api();
  static const uint64_t kEmpty = 0;   // ORT wants a non-null pointer even for zero-size tensors
  std::vector<OrtValue*> in(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputTensor& t = inputs[i];
    void* data = const_cast<void*>(t.bytes ? t.data : static_cast<const void*>(&kEmpty));
    OrtStatus* st =
        api.CreateTensorWithDataAsOrtValue(mem_, data, t.bytes, t.shape.data(), t.shape.size(), t.type, &in[i]);
    if (st != nullptr) {
      for (OrtValue* v : in)
        if (v) api.ReleaseValue(v);
      failed(st);
    }
  }
  return in;
}

void OrtSessionHandle::failed(OrtStatus* st) const {
  fail(SPOT_ERR_RUNTIME, "onnxruntime failed running " + path_ + ": " + take_message(st).substr(0, 400));
}

std::vector<OrtOutput> OrtSessionHandle::run(const std::vector<std::string>& input_names,
                                             const std::vector<InputTensor>& inputs,
                                             const std::vector<std::string>& output_names,
                                             const std::vector<BorrowedInput>& borrowed) const {
  const OrtApi& api = ort_api();
  std::vector<OrtValue*> owned = host_values(inputs);
  std::vector<const OrtValue*> in(owned.begin(), owned.end());
  std::vector<const char*> in_names, out_names;
  for (const auto& n : input_names) in_names.push_back(n.c_str());
  for (const auto& b : borrowed) {
    in_names.push_back(b.name.c_str());
    in.push_back(b.value);
  }
  for (const auto& n : output_names) out_names.push_back(n.c_str());
  std::vector<OrtValue*> out(output_names.size(), nullptr);
  OrtStatus* st = api.Run(session_, nullptr, in_names.data(), in.data(), in.size(), out_names.data(),
                          out_names.size(), out.data());
  for (OrtValue* v : owned) api.ReleaseValue(v);
  if (st != nullptr) {
    for (OrtValue* v : out)
      if (v) api.ReleaseValue(v);
    failed(st);
  }
  std::vector<OrtOutput> result;
  result.reserve(out.size());
  for (OrtValue* v : out) result.emplace_back(v);
  return result;
}

std::vector<OrtOutput> OrtSessionHandle::run_keeping(const std::vector<std::string>& input_names,
                                                     const std::vector<InputTensor>& inputs,
                                                     const std::vector<std::string>& output_names,
                                                     const MemoryPlace& place,
                                                     const std::vector<BorrowedInput>& borrowed) const {
  return run_placed(input_names, inputs, output_names,
                    std::vector<const MemoryPlace*>(output_names.size(), &place), borrowed);
}

std::vector<OrtOutput> OrtSessionHandle::run_placed(const std::vector<std::string>& input_names,
                                                    const std::vector<InputTensor>& inputs,
                                                    const std::vector<std::string>& output_names,
                                                    const std::vector<const MemoryPlace*>& places,
                                                    const std::vector<BorrowedInput>& borrowed) const {
  const OrtApi& api = ort_api();
  std::vector<OrtValue*> owned = host_values(inputs);
  OrtIoBinding* binding = nullptr;
  OrtStatus* st = api.CreateIoBinding(session_, &binding);
  for (size_t i = 0; i < owned.size() && st == nullptr; ++i)
    st = api.BindInput(binding, input_names[i].c_str(), owned[i]);
  for (size_t i = 0; i < borrowed.size() && st == nullptr; ++i)
    st = api.BindInput(binding, borrowed[i].name.c_str(), borrowed[i].value);
  for (size_t i = 0; i < output_names.size() && st == nullptr; ++i)
    st = api.BindOutputToDevice(binding, output_names[i].c_str(), places.at(i)->info());
  if (st == nullptr) st = api.RunWithBinding(session_, nullptr, binding);
  OrtValue** values = nullptr;
  size_t count = 0;
  OrtAllocator* alloc = nullptr;
  if (st == nullptr) st = api.GetAllocatorWithDefaultOptions(&alloc);
  if (st == nullptr) st = api.GetBoundOutputValues(binding, alloc, &values, &count);
  std::vector<OrtOutput> result;   // owns the values from here, whatever follows
  if (st == nullptr) {
    result.reserve(count);
    for (size_t i = 0; i < count; ++i) result.emplace_back(values[i]);
    st = api.AllocatorFree(alloc, values);
  }
  if (binding) api.ReleaseIoBinding(binding);
  for (OrtValue* v : owned) api.ReleaseValue(v);
  if (st != nullptr) failed(st);
  if (result.size() != output_names.size())
    fail(SPOT_ERR_RUNTIME, path_ + " returned " + std::to_string(result.size()) + " outputs, expected " +
                               std::to_string(output_names.size()));
  return result;
}

MemoryPlace::MemoryPlace(Device device) {
  const OrtApi& api = ort_api();
  if (device == Device::kCpu)
    check(api.CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &info_), "CreateCpuMemoryInfo");
  else   // TensorRT's outputs live in CUDA memory too
    check(api.CreateMemoryInfo("Cuda", OrtDeviceAllocator, 0, OrtMemTypeDefault, &info_), "CreateMemoryInfo");
}

MemoryPlace::~MemoryPlace() {
  if (info_) ort_api().ReleaseMemoryInfo(info_);
}

}  // namespace spot
