// The GPU platforms' shared Ops: stream, device properties, dtype mapping (gpu_ops.h).
#include "platform/gpu/gpu_ops.h"

#include <cstdlib>

namespace mla::gpu {

Elem elem_of(DType t) {
  switch (t) {
    case DType::F32: return Elem::F32;
    case DType::BF16: return Elem::BF16;
    case DType::F8_E4M3FN: return Elem::FP8_E4M3FN;
    case DType::F8_E4M3FNUZ: return Elem::FP8_E4M3FNUZ;
    default:
      fail("gpu: dtype {} is not supported on the device (f32, bf16, fp8_e4m3fn, fp8_e4m3fnuz)", dtype_name(t));
  }
}

void expect(bool ok, const char* op, const std::string& what) {
  if (!ok) fail("gpu {}: {}", op, what);
}

GpuOps::GpuOps(Platform platform, DType act) : platform_(platform), act_(act) {
  if (device_count() == 0) fail("{}: no {} device is available", platform_name(platform), kRuntimeName);
  cudaStream_t s = nullptr;
  MLA_GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Tensors free themselves in stream order, so the stream lives as long as the last of them.
  stream_owner_ = std::shared_ptr<StreamObject>(s, [](cudaStream_t q) {
    (void)cudaStreamSynchronize(q);  // destructors report nothing
    (void)cudaStreamDestroy(q);
  });
  stream_ = s;
  cudaDeviceProp prop{};
  MLA_GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  num_sms_ = prop.multiProcessorCount;
  // Tests set MLA_CUDA_POISON=1: every new buffer starts as NaN, so an output a kernel forgot to
  // write shows up instead of passing on stale zeros.
  const char* poison = std::getenv("MLA_CUDA_POISON");
  poison_ = poison && std::string(poison) == "1";
}

GpuOps::~GpuOps() {
  (void)cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : upload_events_)
    if (e) (void)cudaEventDestroy(e);
}

std::shared_ptr<void> GpuOps::alloc_staging(size_t bytes) {
  void* p = nullptr;
  MLA_GPU_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeHost(q); });
}

void GpuOps::upload_async(const void* host, Tensor& dst, size_t offset, size_t n, int slot) {
  expect(dst.platform() == platform_ && offset + n <= dst.nbytes() && slot >= 0 && slot < kUploadSlots,
         "upload_async", fmt::format("{} bytes at {} into a tensor of {} bytes (slot {})", n, offset, dst.nbytes(), slot));
  cudaEvent_t& e = upload_events_[size_t(slot)];
  if (!e) MLA_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  MLA_GPU_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data()) + offset, host, n, cudaMemcpyHostToDevice, stream_));
  MLA_GPU_CHECK(cudaEventRecord(e, stream_));
}

void GpuOps::wait_upload(int slot) {
  expect(slot >= 0 && slot < kUploadSlots, "wait_upload", fmt::format("slot {}", slot));
  if (cudaEvent_t e = upload_events_[size_t(slot)]) MLA_GPU_CHECK(cudaEventSynchronize(e));
}

void GpuOps::synchronize() { MLA_GPU_CHECK(cudaStreamSynchronize(stream_)); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace mla::gpu
