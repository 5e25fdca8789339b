// A thin RAII layer over ONNX Runtime's C API (onnxruntime_c_api.h): one process-wide environment, sessions,
// tensors that borrow host memory, and outputs owned by ORT. Every OrtStatus becomes a SpotException.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace spot {

const OrtApi& ort_api();                 // throws SPOT_ERR_RUNTIME when the library lacks this API version
std::string ort_version();

// Where a session runs, as spot.engines.ort_sessions.providers_for: the CPU execution provider, CUDA, or TensorRT
// with CUDA for the nodes TensorRT does not take (the CPU provider serves what neither takes).
enum class Device { kCpu, kCuda, kTensorRT };

struct SessionConfig {
  int intra_threads = 0;                 // 0: ORT's default
  bool single_inter_thread = false;      // set inter-op threads to 1 (as the Python runtime does with threads)
  Device device = Device::kCpu;
  std::string trt_cache_dir;             // TensorRT: engine cache folder (created when absent)
  bool trt_fp16 = false;                 // TensorRT: build fp16 engines (an fp16 export)
  // TensorRT: explicit shape ranges, ORT's trt_profile_{min,opt,max}_shapes strings ("name:AxB,..."); empty: none
  std::string trt_profile_min, trt_profile_opt, trt_profile_max;
  bool cuda_exact_arena = false;         // CUDA: grow the memory arena by what is requested, not to the next power
                                         // of two (a session whose outputs grow by one block per run: the KV cache)
  // session config entries (AddSessionConfigEntry), e.g. a quantized export's manifest "ort_session_config"
  std::vector<std::pair<std::string, std::string>> config_entries;
};

std::vector<std::string> available_providers();   // what the linked ONNX Runtime library offers

// A tensor that borrows host memory for one Run call.
struct InputTensor {
  ONNXTensorElementDataType type;
  std::vector<int64_t> shape;
  const void* data;
  size_t bytes;
};

class OrtOutput {
 public:
  explicit OrtOutput(OrtValue* v) : v_(v) {}
  OrtOutput(OrtOutput&& o) noexcept : v_(o.v_) { o.v_ = nullptr; }
  OrtOutput& operator=(OrtOutput&& o) noexcept;     // releases the value held before
  OrtOutput(const OrtOutput&) = delete;
  ~OrtOutput();
  std::vector<int64_t> shape() const;
  ONNXTensorElementDataType type() const;
  const void* data() const;          // where the tensor is (dereference host outputs only)
  const OrtValue* value() const { return v_; }
  // A tensor of `shape` over this one's elements from `first` on, in the same memory (host or device), no copy:
  // valid while this output lives. float32 / float16 tensors (a pass's logits, a layer's new K/V).
  OrtOutput view(size_t first, std::vector<int64_t> shape) const;

 private:
  OrtValue* v_;
};

// Where an output is kept: CPU memory, or device 0 of the CUDA provider (an OrtValue that never reaches the host).
class MemoryPlace {
 public:
  explicit MemoryPlace(Device device);
  ~MemoryPlace();
  MemoryPlace(const MemoryPlace&) = delete;
  MemoryPlace& operator=(const MemoryPlace&) = delete;
  const OrtMemoryInfo* info() const { return info_; }

 private:
  OrtMemoryInfo* info_ = nullptr;
};

// An ORT value fed to a session as it is (on whatever device holds it).
struct BorrowedInput {
  std::string name;
  const OrtValue* value;
};

// One ONNX Runtime session. Its run / run_keeping may be called from several threads at once (OrtApi::Run is
// thread-safe; each call binds its own inputs and outputs): decoders over one opened model share its sessions.
class OrtSessionHandle {
 public:
  OrtSessionHandle(const std::string& path, const SessionConfig& cfg);
  ~OrtSessionHandle();
  OrtSessionHandle(const OrtSessionHandle&) = delete;
  OrtSessionHandle& operator=(const OrtSessionHandle&) = delete;

  const std::vector<std::string>& input_names() const { return inputs_; }
  const std::vector<std::string>& output_names() const { return outputs_; }
  // What the graph declares for the input or output `name`: its element type and dims (-1 where dynamic); found
  // false when it has no such input or output.
  struct Declared {
    bool found = false;
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    std::vector<int64_t> dims;
  };
  Declared declared(const std::string& name) const;
  std::vector<OrtOutput> run(const std::vector<std::string>& input_names, const std::vector<InputTensor>& inputs,
                             const std::vector<std::string>& output_names,
                             const std::vector<BorrowedInput>& borrowed = {}) const;
  // Outputs left where `place` says (IOBinding), in the order of output_names: a GPU engine's logits stay on the
  // device for the epilogue, its new K/V for the device KV cache.
  std::vector<OrtOutput> run_keeping(const std::vector<std::string>& input_names,
                                     const std::vector<InputTensor>& inputs,
                                     const std::vector<std::string>& output_names, const MemoryPlace& place,
                                     const std::vector<BorrowedInput>& borrowed = {}) const;
  // As run_keeping, output i kept where places[i] says (a fused store pass: its logits where the target ran for the
  // device sampler, its new K/V in host memory).
  std::vector<OrtOutput> run_placed(const std::vector<std::string>& input_names,
                                    const std::vector<InputTensor>& inputs,
                                    const std::vector<std::string>& output_names,
                                    const std::vector<const MemoryPlace*>& places,
                                    const std::vector<BorrowedInput>& borrowed = {}) const;

 private:
  OrtSession* session_ = nullptr;
  OrtMemoryInfo* mem_ = nullptr;
  std::vector<std::string> inputs_, outputs_;
  std::string path_;
  std::vector<OrtValue*> host_values(const std::vector<InputTensor>& inputs) const;   // released by the caller
  [[noreturn]] void failed(OrtStatus* st) const;
};

}  // namespace spot
