// libFuzzer: model.safetensors.index.json. Each input becomes the index of a temp folder that
// holds two valid shards, opened with Checkpoint::open.
#include <filesystem>

#include <unistd.h>

#include "fuzz_checks.h"

namespace {
std::string g_dir;
void remove_dir() {
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  g_dir = (base / ("mla_fuzz_index_" + std::to_string(::getpid()))).string();
  fs::create_directories(g_dir);
  std::atexit(remove_dir);
  mla::fuzz::make_index_folder(g_dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::checkpoint_index(g_dir, data, size);
  return 0;
}
