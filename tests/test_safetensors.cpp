// test_safetensors.cpp — safetensors reading/writing, checkpoint folders, and broken files.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "mla/error.h"
#include "mla/safetensors.h"

namespace mla {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("mla_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
             std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((n >> (8 * i)) & 0xff);
  return s;
}

// A raw safetensors file: length (the header's own unless `n` is given), header, data.
std::string raw(const std::string& header, const std::string& data = "",
                std::optional<uint64_t> n = std::nullopt) {
  return le64(n ? *n : header.size()) + header + data;
}

// A host tensor of `shape` filled with random bytes (any bit pattern: NaNs, denormals, ...).
Tensor random_bytes(DType dtype, Shape shape, uint64_t seed) {
  Tensor t = Tensor::host(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// Runs `f`, expecting an mla::Error whose message contains `fragment` (and is one line).
const std::vector<DType> kSupported = {DType::F64, DType::F32,       DType::BF16, DType::F16,
                                       DType::F8_E4M3FN, DType::I32, DType::I64};

// ---- round trips ------------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDtypeBitExact) {
  TempDir dir;
  const std::vector<Shape> shapes = {{3, 5}, {7}, {}, {2, 3, 5}, {1, 1}, {13}};
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t seed = 1;
  for (DType t : kSupported)
    for (const Shape& s : shapes)
      tensors.emplace_back(fmt::format("layer.{}.{}", dtype_name(t), seed),
                           random_bytes(t, s, seed++));
  const std::string path = dir / "model.safetensors";
  write_safetensors(path, tensors);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // The header is padded to 8 bytes and every tensor starts aligned to its element size.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.size(), tensors.size());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(bytes.find("__metadata__"), std::string::npos);
  const std::vector<std::string> names = f.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const auto& [name, want] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.has(name));
    const auto& info = f.info(name);
    ASSERT_TRUE(info.dtype.has_value());
    EXPECT_EQ(*info.dtype, want.dtype());
    EXPECT_EQ(info.st_dtype, safetensors_dtype_name(want.dtype()));
    EXPECT_EQ(info.shape, want.shape());
    EXPECT_EQ(info.nbytes, want.nbytes());
    EXPECT_EQ(info.offset % dtype_size(want.dtype()), 0u);
    ASSERT_LE(info.offset + info.nbytes, bytes.size());
    EXPECT_EQ(std::memcmp(bytes.data() + info.offset, want.data(), want.nbytes()), 0);

    Tensor got = f.tensor(name);
    EXPECT_TRUE(same_bytes(got, want));
    EXPECT_EQ(got.platform(), Platform::CPU);
    Tensor v = f.view(name);
    EXPECT_TRUE(same_bytes(v, want));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % dtype_size(want.dtype()), 0u);
  }
  EXPECT_EQ(safetensors_dtype_name(DType::F8_E4M3FN), "F8_E4M3");
  EXPECT_EQ(safetensors_dtype_name(DType::BF16), "BF16");
  expect_error([] { safetensors_dtype_name(DType::F8_E4M3FNUZ); }, "fp8_e4m3fnuz", "fnuz name");
}

TEST(Safetensors, ValuesSurviveThroughDoubles) {
  TempDir dir;
  Tensor a = random_tensor({4, 6}, DType::BF16, 7);
  Tensor b = random_tensor({5}, DType::F32, 8);
  write_safetensors(dir / "x.safetensors", {{"a", a}, {"b", b}});
  SafetensorsFile f = SafetensorsFile::open(dir / "x.safetensors");
  EXPECT_EQ(f.tensor("a").to_doubles(), a.to_doubles());
  EXPECT_EQ(f.view("b").to_doubles(), b.to_doubles());
}

TEST(Safetensors, MetadataRoundTrip) {
  TempDir dir;
  const std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"note", "line one\nline \"two\" ü"},
      {"empty", ""},
      {"brackets", std::string(200, '[') + "\\\"{" + std::string(200, '{')}};  // not nesting
  write_safetensors(dir / "m.safetensors", {{"w", random_bytes(DType::F32, {2}, 3)}}, meta);
  SafetensorsFile f = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.names(), std::vector<std::string>{"w"});

  // Metadata alone, no tensors: an empty data section.
  write_safetensors(dir / "meta_only.safetensors", {}, meta);
  SafetensorsFile g = SafetensorsFile::open(dir / "meta_only.safetensors");
  EXPECT_EQ(g.metadata(), meta);
  EXPECT_EQ(g.size(), 0u);
}

TEST(Safetensors, ZeroElementTensorsAndEmptyFiles) {
  TempDir dir;
  Tensor e0 = Tensor::host(DType::F32, {0});
  Tensor e1 = Tensor::host(DType::BF16, {4, 0, 3});
  Tensor x = random_bytes(DType::F16, {3}, 9);
  write_safetensors(dir / "z.safetensors", {{"e0", e0}, {"e1", e1}, {"x", x}});
  SafetensorsFile f = SafetensorsFile::open(dir / "z.safetensors");
  EXPECT_EQ(f.info("e1").shape, (Shape{4, 0, 3}));
  EXPECT_EQ(f.info("e1").nbytes, 0u);
  for (const char* name : {"e0", "e1"}) {
    Tensor t = f.tensor(name);
    EXPECT_TRUE(t.defined());
    EXPECT_EQ(t.numel(), 0);
    EXPECT_EQ(f.view(name).numel(), 0);
  }
  EXPECT_TRUE(same_bytes(f.tensor("x"), x));

  // No tensors at all.
  write_safetensors(dir / "empty.safetensors", {});
  SafetensorsFile g = SafetensorsFile::open(dir / "empty.safetensors");
  EXPECT_EQ(g.size(), 0u);
  EXPECT_TRUE(g.names().empty());
  EXPECT_EQ(read_bytes(dir / "empty.safetensors"), le64(8) + "{}      ");

  // Only zero-element tensors, every one at the end of an empty data section.
  write_bytes(dir / "only_empty.safetensors",
              raw(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                  R"("b":{"dtype":"I64","shape":[2,0],"data_offsets":[0,0]}})"));
  SafetensorsFile h = SafetensorsFile::open(dir / "only_empty.safetensors");
  EXPECT_EQ(h.tensor("b").shape(), (Shape{2, 0}));
}

TEST(Safetensors, ViewsAreZeroCopyAndOutliveTheFileObject) {
  TempDir dir;
  Tensor w = random_bytes(DType::F32, {64, 8}, 11);
  write_safetensors(dir / "v.safetensors", {{"w", w}});
  Tensor v;
  {
    SafetensorsFile f = SafetensorsFile::open(dir / "v.safetensors");
    v = f.view("w");
    Tensor v2 = f.view("w");
    EXPECT_EQ(v.data(), v2.data());            // same mapping
    EXPECT_NE(f.tensor("w").data(), v.data());  // tensor() copies
  }
  EXPECT_TRUE(same_bytes(v, w));  // the mapping outlives the SafetensorsFile

  // A misaligned tensor (header of odd length, no padding) comes back as an aligned copy.
  std::string data(2, '\0');
  data += std::string(static_cast<const char*>(w.data()), 16);
  write_bytes(dir / "odd.safetensors",
              raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[2,18]}})", data));
  SafetensorsFile g = SafetensorsFile::open(dir / "odd.safetensors");
  EXPECT_NE(g.info("w").offset % 4, 0u);
  Tensor ov = g.view("w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ov.data()) % 4, 0u);
  EXPECT_EQ(std::memcmp(ov.data(), w.data(), 16), 0);
}

TEST(Safetensors, HandWrittenFileWithGapsUnsortedEntriesAndExtraDtypes) {
  TempDir dir;
  // Entries out of offset order, a gap of 4 bytes, a U8 and a BOOL tensor mla does not hold, an
  // F4 tensor (half a byte per element), unknown extra fields in an entry.
  std::string data;
  for (int i = 0; i < 40; ++i) data += char(i);
  const std::string header =
      R"({"b":{"dtype":"I32","shape":[2],"data_offsets":[20,28],"extra":1},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("u":{"dtype":"U8","shape":[3],"data_offsets":[28,31]},)"
      R"("flag":{"dtype":"BOOL","shape":[1],"data_offsets":[31,32]},)"
      R"("f4":{"dtype":"F4","shape":[2,8],"data_offsets":[32,40]},)"
      R"("__metadata__":{"k":"v"}})";
  write_bytes(dir / "h.safetensors", raw(header, data));
  SafetensorsFile f = SafetensorsFile::open(dir / "h.safetensors");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "f4", "flag", "u"}));
  EXPECT_EQ(f.metadata().at("k"), "v");
  const size_t base = 8 + header.size();
  EXPECT_EQ(f.info("b").offset, base + 20);
  EXPECT_EQ(f.info("u").st_dtype, "U8");
  EXPECT_FALSE(f.info("u").dtype.has_value());
  EXPECT_EQ(f.info("f4").nbytes, 8u);
  Tensor b = f.tensor("b");
  EXPECT_EQ(b.dtype(), DType::I32);
  EXPECT_EQ(std::memcmp(b.data(), data.data() + 20, 8), 0);
  EXPECT_EQ(std::memcmp(f.tensor("a").data(), data.data(), 16), 0);
  expect_error([&] { f.tensor("u"); }, "tensor 'u' has unsupported dtype U8", "U8 read");
  expect_error([&] { f.view("flag"); }, "unsupported dtype BOOL", "BOOL view");
  expect_error([&] { f.info("nope"); }, "no tensor named 'nope'", "absent info");
  expect_error([&] { f.tensor("nope"); }, "h.safetensors: no tensor named 'nope'", "absent tensor");
}

// ---- checkpoints ------------------------------------------------------------------------------

TEST(Checkpoint, SingleFileFolderAndFilePath) {
  TempDir dir;
  Tensor w = random_bytes(DType::BF16, {4, 4}, 21);
  write_safetensors(dir / "model.safetensors", {{"model.w", w}});
  for (const std::string& p : {dir.path().string(), dir / "model.safetensors"}) {
    Checkpoint c = Checkpoint::open(p);
    EXPECT_EQ(c.names(), std::vector<std::string>{"model.w"});
    EXPECT_EQ(c.files().size(), 1u);
    EXPECT_TRUE(same_bytes(c.tensor("model.w"), w));
    EXPECT_EQ(c.file("model.w").path(), dir / "model.safetensors");
    EXPECT_FALSE(c.find("absent").has_value());
  }
  TempDir empty;
  expect_error([&] { Checkpoint::open(empty.path().string()); }, "neither", "empty folder");
  expect_error([&] { Checkpoint::open(empty / "missing"); }, "no such file", "missing path");
}

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> s1 = {
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", random_bytes(DType::F8_E4M3FN,
                                                                          {576, 32}, 31)},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv",
       random_bytes(DType::F32, {5, 1}, 32)}};
  std::vector<std::pair<std::string, Tensor>> s2 = {
      {"model.layers.0.self_attn.o_proj.weight", random_bytes(DType::BF16, {32, 64}, 33)},
      {"model.embed_tokens.weight", random_bytes(DType::BF16, {10, 32}, 34)}};
  write_safetensors(dir / "model-00001-of-00002.safetensors", s1);
  write_safetensors(dir / "model-00002-of-00002.safetensors", s2);
  nlohmann::json index = {{"metadata", {{"total_size", 12345}}},
                          {"weight_map", nlohmann::json::object()}};
  for (const auto& [n, _] : s1) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, _] : s2) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  write_bytes(dir / "model.safetensors.index.json", index.dump(2));

  for (const std::string& p : {dir.path().string(), dir / "model.safetensors.index.json"}) {
    Checkpoint c = Checkpoint::open(p);
    EXPECT_EQ(c.size(), 4u);
    EXPECT_EQ(c.files().size(), 2u);
    const auto names = c.names();
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    for (const auto* shard : {&s1, &s2})
      for (const auto& [n, t] : *shard) {
        SCOPED_TRACE(n);
        ASSERT_TRUE(c.has(n));
        EXPECT_TRUE(same_bytes(c.tensor(n), t));
        EXPECT_TRUE(same_bytes(c.view(n), t));
        EXPECT_TRUE(same_bytes(*c.find(n), t));
        EXPECT_EQ(c.info(n).shape, t.shape());
      }
    EXPECT_EQ(c.file("model.embed_tokens.weight").path(),
              dir / "model-00002-of-00002.safetensors");
    EXPECT_EQ(*c.info("model.layers.0.self_attn.kv_a_proj_with_mqa.weight").dtype,
              DType::F8_E4M3FN);
    expect_error([&] { c.tensor("lm_head.weight"); }, "no tensor named 'lm_head.weight'",
                 "absent");
  }
}

TEST(Checkpoint, BrokenIndexes) {
  const std::string shard_a = "a.safetensors", shard_b = "b.safetensors";
  auto setup = [&](const TempDir& dir, const std::string& index_text) {
    write_safetensors(dir / shard_a, {{"x", random_bytes(DType::F32, {2}, 1)}});
    write_safetensors(dir / shard_b, {{"y", random_bytes(DType::F32, {2}, 2)}});
    write_bytes(dir / "model.safetensors.index.json", index_text);
  };
  struct Case {
    const char* what;
    std::string index;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"not JSON", "{\"weight_map\": ", "not valid JSON"},
      {"NUL byte", std::string("{}\0", 3), "not valid JSON"},
      {"deep nesting", std::string(100000, '[') + std::string(100000, ']'), "deeper than 64"},
      {"not an object", "[1]", "not a JSON object"},
      {"missing weight_map", R"({"metadata": {}})", "missing \"weight_map\""},
      {"weight_map not an object", R"({"weight_map": []})", "\"weight_map\" is not an object"},
      {"value not a string", R"({"weight_map": {"x": 1}})", "entry 'x' is not a string"},
      {"missing shard", R"({"weight_map": {"x": "a.safetensors", "z": "c.safetensors"}})",
       "shard 'c.safetensors' (holding tensor 'z') does not exist"},
      {"escaping shard", R"({"weight_map": {"x": "../a.safetensors"}})",
       "not a file inside the folder"},
      {"absolute shard", R"({"weight_map": {"x": "/etc/passwd"}})", "not a file inside"},
      {"shard lacks tensor", R"({"weight_map": {"x": "a.safetensors", "q": "a.safetensors"}})",
       "maps tensor 'q' to shard 'a.safetensors', which lacks it"},
      {"tensor in another shard",
       R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}})",
       "maps tensor 'y' to shard 'a.safetensors', which lacks it (it is in"},
  };
  for (const Case& k : cases) {
    TempDir dir;
    setup(dir, k.index);
    expect_error([&] { Checkpoint::open(dir.path().string()); }, k.fragment, k.what);
  }
  // The same tensor in two shards.
  TempDir dir;
  setup(dir, R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  write_safetensors(dir / shard_b, {{"x", random_bytes(DType::F32, {2}, 3)},
                                    {"y", random_bytes(DType::F32, {2}, 4)}});
  expect_error([&] { Checkpoint::open(dir.path().string()); }, "tensor 'x' is in two shards",
               "duplicate");
  // A broken shard: the error names the shard file.
  write_bytes(dir / shard_b, le64(3) + "{}");
  expect_error([&] { Checkpoint::open(dir.path().string()); }, "b.safetensors: header length 3",
               "broken shard");
}

// ---- broken files -------------------------------------------------------------------------------

// A valid two-tensor file, to cut and corrupt.
std::string valid_file() {
  std::string data(24, '\x11');
  return raw(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
             R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}})",
             data);
}

std::string entry(const std::string& fields) { return R"({"x":{)" + fields + "}}"; }

TEST(Safetensors, BrokenFilesGiveOneLineErrors) {
  const std::string v = valid_file();
  const std::string d16(16, '\0');
  struct Case {
    const char* what;
    std::string bytes;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"empty file", "", "file is 0 bytes, too short"},
      {"cut in the length", v.substr(0, 5), "file is 5 bytes, too short"},
      {"cut in the header", v.substr(0, 30), "runs past the end of the file (30 bytes"},
      {"cut in the data", v.substr(0, v.size() - 3),
       "tensor 'b': data_offsets [16, 24] run past the end of the data section (21 bytes"},
      {"header length past the end", raw("{}", "", 9), "header length 9 runs past the end"},
      {"header length 10 GB", raw("{}", "", 10'000'000'000ull),
       "header length 10000000000 exceeds the 100000000 byte limit"},
      {"header length 2^64-1", raw("{}", "", ~0ull), "exceeds the 100000000 byte limit"},
      {"header length 0", raw("{}", "", 0), "header length is 0"},
      {"not JSON", raw("{nope}"), "header is not valid JSON: parse error"},
      {"trailing bytes after the JSON", raw("{} x"), "header is not valid JSON"},
      {"non-UTF-8 in a string", raw("{\"a\xff\":{}}"), "UTF-8"},
      {"overlong UTF-8", raw("{\"\xc0\xaf\":1}"), "UTF-8"},
      {"non-UTF-8 outside strings", raw("{\xfe}"), "header is not valid JSON"},
      {"NUL bytes in the header", raw(std::string("{}\0\0", 4)), "header is not valid JSON"},
      {"number too large for a double", raw(R"({"x":1e999})"), "header is not valid JSON"},
      {"deep nesting", raw(std::string(100000, '[') + std::string(100000, ']')),
       "header nests JSON deeper than 64 levels"},
      {"deep nesting, unclosed", raw("{\"__metadata__\":" + std::string(100000, '{')),
       "header nests JSON deeper than 64 levels"},
      {"not an object", raw("[1, 2]"), "header is not a JSON object (got [1,2])"},
      {"a string", raw("\"hi\""), "header is not a JSON object"},
      {"entry not an object", raw(R"({"x":3})"), "tensor 'x': entry is not an object"},
      {"missing dtype", raw(entry(R"("shape":[1],"data_offsets":[0,4])"), "1234"),
       "tensor 'x': missing \"dtype\""},
      {"missing shape", raw(entry(R"("dtype":"F32","data_offsets":[0,4])"), "1234"),
       "missing \"shape\""},
      {"missing data_offsets", raw(entry(R"("dtype":"F32","shape":[1])"), "1234"),
       "tensor 'x': missing \"data_offsets\""},
      {"dtype not a string", raw(entry(R"("dtype":32,"shape":[1],"data_offsets":[0,4])"), "1234"),
       "\"dtype\" is not a string"},
      {"unknown dtype", raw(entry(R"("dtype":"F12","shape":[1],"data_offsets":[0,4])"), "1234"),
       "tensor 'x': unknown dtype 'F12'"},
      {"lowercase dtype", raw(entry(R"("dtype":"f32","shape":[1],"data_offsets":[0,4])"), "1234"),
       "unknown dtype 'f32'"},
      {"shape not an array",
       raw(entry(R"("dtype":"F32","shape":4,"data_offsets":[0,16])"), d16),
       "\"shape\" is not an array"},
      {"negative dim", raw(entry(R"("dtype":"F32","shape":[2,-2],"data_offsets":[0,16])"), d16),
       "shape [2,-2] has a negative dimension (-2)"},
      {"non-integer dim", raw(entry(R"("dtype":"F32","shape":[2,2.5],"data_offsets":[0,16])"),
                              d16),
       "has a dimension that is not an integer (2.5)"},
      {"integral float dim",
       raw(entry(R"("dtype":"F32","shape":[2,2.0],"data_offsets":[0,16])"), d16),
       "not an integer"},
      {"string dim", raw(entry(R"("dtype":"F32","shape":["4"],"data_offsets":[0,16])"), d16),
       "not an integer"},
      {"dim beyond int64",
       raw(entry(R"("dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1])"), "1"),
       "too many elements (overflow)"},
      {"element count overflow",
       raw(entry(R"("dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1])"), "1"),
       "too many elements (overflow)"},
      {"byte count overflow",
       raw(entry(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,1])"), "1"),
       "(overflow)"},
      {"data_offsets one number",
       raw(entry(R"("dtype":"F32","shape":[1],"data_offsets":[4])"), "1234"),
       "\"data_offsets\" is not two non-negative integers (got [4])"},
      {"data_offsets negative",
       raw(entry(R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])"), "1234"),
       "not two non-negative integers"},
      {"data_offsets not numbers",
       raw(entry(R"("dtype":"F32","shape":[1],"data_offsets":"0-4")"), "1234"),
       "not two non-negative integers"},
      {"data_offsets float",
       raw(entry(R"("dtype":"F32","shape":[1],"data_offsets":[0,4.0])"), "1234"),
       "not two non-negative integers"},
      {"begin after end", raw(entry(R"("dtype":"U8","shape":[0],"data_offsets":[8,4])"), d16),
       "data_offsets [8, 4] begin after they end"},
      {"wrong byte length",
       raw(entry(R"("dtype":"F32","shape":[2,2],"data_offsets":[0,12])"), d16),
       "tensor 'x': data_offsets [0, 12] do not match dtype F32 × shape [2, 2] = 16 bytes"},
      {"header pointing past the end",
       raw(entry(R"("dtype":"F32","shape":[4],"data_offsets":[8,24])"), d16),
       "data_offsets [8, 24] run past the end of the data section (16 bytes"},
      {"huge offsets",
       raw(entry(R"("dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,)"
                 R"(18446744073709551615])"),
           d16),
       "run past the end of the data section"},
      {"overlapping tensors",
       raw(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
           R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
           std::string(24, '\0')),
       "tensors 'a' data_offsets [0, 16] and 'b' data_offsets [8, 24] overlap"},
      {"nested tensors",
       raw(R"({"big":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},)"
           R"("mid":{"dtype":"U8","shape":[4],"data_offsets":[20,24]},)"
           R"("small":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
           std::string(32, '\0')),
       "overlap"},
      {"same range twice",
       raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
           R"("b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
           "1234"),
       "tensors 'a' data_offsets [0, 4] and 'b' data_offsets [0, 4] overlap"},
      {"half a byte", raw(entry(R"("dtype":"F4","shape":[3],"data_offsets":[0,2])"), "12"),
       "F4 × shape [3] is not a whole number of bytes"},
      {"metadata not an object", raw(R"({"__metadata__":[1]})"),
       "\"__metadata__\" is not an object"},
      {"metadata value not a string", raw(R"({"__metadata__":{"n":1}})"),
       "\"__metadata__\" value for key 'n' is not a string (got 1)"},
      {"control characters in a name", raw("{\"a\\nb\":5}"), "tensor 'a\\x0ab': entry"},
  };
  TempDir dir;
  int i = 0;
  for (const Case& k : cases) {
    const std::string path = dir / fmt::format("broken{}.safetensors", i++);
    write_bytes(path, k.bytes);
    expect_error([&] { SafetensorsFile::open(path); }, path + ": " , k.what);
    expect_error([&] { SafetensorsFile::open(path); }, k.fragment, k.what);
  }
  expect_error([&] { SafetensorsFile::open(dir / "absent.safetensors"); },
               "absent.safetensors: cannot open: No such file", "absent file");
  expect_error([&] { SafetensorsFile::open(dir.path().string()); }, "not a regular file",
               "a folder");
}

// Every prefix of a valid file, and many random corruptions of it: opening must either succeed
// (and then every tensor reads in bounds) or throw mla::Error — never crash or throw otherwise.
TEST(Safetensors, CutsAndCorruptionsNeverCrash) {
  TempDir dir;
  const std::string good = dir / "good.safetensors";
  write_safetensors(good,
                    {{"a", random_bytes(DType::F32, {3, 2}, 1)},
                     {"b", random_bytes(DType::BF16, {5}, 2)},
                     {"c", random_bytes(DType::F8_E4M3FN, {7}, 3)},
                     {"e", Tensor::host(DType::I64, {0})}},
                    {{"format", "pt"}});
  const std::string bytes = read_bytes(good);
  const std::string path = dir / "bad.safetensors";
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(path, bytes.substr(0, n));
    EXPECT_THROW(SafetensorsFile::open(path), Error) << "cut at " << n;
  }
  std::mt19937_64 rng(42);
  int opened = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string b = bytes;
    const int flips = 1 + int(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      size_t pos = rng() % b.size();
      // Mostly digits and structure in the header; sometimes any byte.
      static const char kChars[] = "0123456789[]{},:\"-.eE ";
      b[pos] = (rng() % 2) ? kChars[rng() % (sizeof(kChars) - 1)] : char(rng());
    }
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    write_bytes(path, b);
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      ++opened;
      for (const std::string& name : f.names()) {
        const auto& info = f.info(name);
        ASSERT_LE(info.offset + info.nbytes, b.size());
        if (!info.dtype) continue;
        EXPECT_EQ(f.tensor(name).nbytes(), info.nbytes);
        EXPECT_EQ(f.view(name).nbytes(), info.nbytes);
      }
    } catch (const Error&) {
    }
  }
  EXPECT_GT(opened, 0);  // some corruptions only touch data bytes
}

// ---- writing ------------------------------------------------------------------------------------

TEST(WriteSafetensors, ReplacesAtomicallyAndRefusesBadInput) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  Tensor a = random_bytes(DType::F32, {4}, 1);
  write_safetensors(path, {{"a", a}});
  const std::string before = read_bytes(path);

  // Bad input is refused before the disk is touched: the old file stays, no temp file.
  Tensor dev(DType::F32, {1}, Platform::CUDA, std::make_shared<float>(0.f));
  const std::vector<std::tuple<const char*, std::vector<std::pair<std::string, Tensor>>,
                               std::string>>
      bad = {
          {"duplicate", {{"a", a}, {"a", a}}, "tensor 'a' is given twice"},
          {"undefined", {{"u", Tensor()}}, "tensor 'u' is undefined"},
          {"reserved name", {{"__metadata__", a}}, "cannot be named \"__metadata__\""},
          {"fnuz", {{"q", Tensor::host(DType::F8_E4M3FNUZ, {2})}}, "safetensors cannot name"},
          {"device tensor", {{"d", dev}}, "tensor 'd' is on cuda, not the host"},
          {"invalid UTF-8 name", {{"bad\xff", a}}, "cannot write the header"},
      };
  for (const auto& [what, tensors, fragment] : bad) {
    expect_error([&] { write_safetensors(path, tensors); }, fragment, what);
    EXPECT_EQ(read_bytes(path), before) << what;
    EXPECT_FALSE(fs::exists(path + ".tmp")) << what;
  }
  expect_error([&] { write_safetensors(path, {{"a", a}}, {{"m", "\xff"}}); },
               "cannot write the header", "invalid UTF-8 metadata");

  // Overwriting works and leaves no temp file.
  Tensor b = random_bytes(DType::I64, {3}, 2);
  write_safetensors(path, {{"b", b}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), std::vector<std::string>{"b"});
  EXPECT_TRUE(same_bytes(f.tensor("b"), b));
}

TEST(WriteSafetensors, UnwritableDestinationsLeaveNoFile) {
  TempDir dir;
  Tensor a = random_bytes(DType::F32, {4}, 1);
  // A folder that does not exist.
  const std::string p1 = dir / "no/such/folder/w.safetensors";
  expect_error([&] { write_safetensors(p1, {{"a", a}}); }, "cannot create", "missing folder");
  EXPECT_FALSE(fs::exists(p1));
  EXPECT_FALSE(fs::exists(p1 + ".tmp"));
  // A "folder" that is a regular file.
  write_bytes(dir / "plain", "x");
  const std::string p2 = dir / "plain/w.safetensors";
  expect_error([&] { write_safetensors(p2, {{"a", a}}); }, "Not a directory", "file as folder");
  // The destination is a folder: the rename fails after the data was written, and the temp file
  // is removed.
  fs::create_directories(dir / "occupied/inner");
  expect_error([&] { write_safetensors(dir / "occupied", {{"a", a}}); }, "cannot rename",
               "destination is a folder");
  EXPECT_FALSE(fs::exists(dir / "occupied.tmp"));
  EXPECT_TRUE(fs::is_directory(dir / "occupied/inner"));
  // A read-only folder (permissions do not bind root, so only checked for other users).
  if (::geteuid() != 0) {
    fs::create_directories(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    expect_error([&] { write_safetensors(dir / "ro/w.safetensors", {{"a", a}}); },
                 "Permission denied", "read-only folder");
    EXPECT_FALSE(fs::exists(dir / "ro/w.safetensors"));
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace mla
