// activity.cpp — CUPTI's activity records of kernels, copies and memsets, through the few entry
// points dlopen finds in libcupti (the library is needed only when a record is asked for).
#include "platform/cuda/activity.h"

#include <cuda_runtime.h>
#include <cupti_activity.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "mla/error.h"
#include "platform/gpu/gpu_check.h"

namespace mla::cuda {
namespace {

struct Cupti {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
};

const Cupti& cupti() {
  static const Cupti c = [] {
    Cupti c;
    void* h = nullptr;
    for (const char* lib : {"libcupti.so", "libcupti.so.13", "libcupti.so.12"})
      if ((h = dlopen(lib, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) fail("cuda activity: libcupti (CUPTI) is not on the library path");
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, name));
      if (!f) fail("cuda activity: libcupti has no {}", name);
    };
    sym(c.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(c.enable, "cuptiActivityEnable");
    sym(c.disable, "cuptiActivityDisable");
    sym(c.flush_all, "cuptiActivityFlushAll");
    sym(c.next_record, "cuptiActivityGetNextRecord");
    return c;
  }();
  return c;
}

void check(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) fail("cuda activity: {} failed (CUPTI error {})", what, int(r));
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
constexpr size_t kBufferBytes = size_t(8) << 20;

std::mutex g_mu;
std::vector<DeviceSpan> g_spans;  // filled by CUPTI's buffer callbacks
bool g_open = false;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cupti().next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      g_spans.push_back({k->start, k->end, k->streamId, k->name ? k->name : "kernel"});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      g_spans.push_back({m->start, m->end, m->streamId, "memcpy"});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      g_spans.push_back({m->start, m->end, m->streamId, "memset"});
    }
  }
  std::free(buffer);
}

}  // namespace

void activity_begin() {
  const Cupti& c = cupti();
  if (g_open) fail("cuda activity: a record is already open");
  MLA_GPU_CHECK(cudaDeviceSynchronize());  // earlier work stays out of the record
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_spans.clear();
  }
  check(c.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind k : kKinds) check(c.enable(k), "cuptiActivityEnable");
  g_open = true;
}

std::vector<DeviceSpan> activity_end() {
  if (!g_open) fail("cuda activity: no record is open");
  const Cupti& c = cupti();
  g_open = false;
  MLA_GPU_CHECK(cudaDeviceSynchronize());
  for (CUpti_ActivityKind k : kKinds) check(c.disable(k), "cuptiActivityDisable");
  check(c.flush_all(1), "cuptiActivityFlushAll");
  std::vector<DeviceSpan> spans;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    spans.swap(g_spans);
  }
  std::sort(spans.begin(), spans.end(), [](const DeviceSpan& a, const DeviceSpan& b) { return a.start_ns < b.start_ns; });
  return spans;
}

}  // namespace mla::cuda
