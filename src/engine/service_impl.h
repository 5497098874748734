// src/engine/service_impl.h — a Service over an Engine the caller owns (tests, embedding).
#pragma once
#include <memory>

#include "engine/scheduler.h"
#include "engine/service.h"

namespace mla::engine {

// Starts the scheduler thread over `engine` (which must outlive the Service and be used by
// nothing else meanwhile).
std::unique_ptr<Service> make_service(Engine& engine, const SchedulerOptions& opt);

}  // namespace mla::engine
