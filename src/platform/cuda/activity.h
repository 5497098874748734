// activity.h — the CUDA device's record of its work (CUPTI's activity API, loaded at run time so
// that nothing else needs libcupti): kernels (graph nodes included), copies and memsets.
#pragma once
#include <vector>

#include "mla/ops.h"

namespace mla::cuda {

// Starts recording; error if CUPTI cannot be loaded or a record is already open.
void activity_begin();
// Waits for the device, stops recording and returns what ran, in start order.
std::vector<DeviceSpan> activity_end();

}  // namespace mla::cuda
