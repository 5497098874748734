// safetensors.cpp — a validating, memory-mapping safetensors reader, checkpoint folders (single
// file or index + shards) and an atomic writer.
#include "mla/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "mla/error.h"

namespace mla {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; mla reads it in place");

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as the reference implementation

// Every dtype safetensors knows, with its width in bits and mla's dtype where there is one.
struct StDtype {
  const char* name;
  int bits;
  std::optional<DType> dtype;
};
const StDtype kStDtypes[] = {
    {"F64", 64, DType::F64},      {"F32", 32, DType::F32},
    {"BF16", 16, DType::BF16},    {"F16", 16, DType::F16},
    {"F8_E4M3", 8, DType::F8_E4M3FN},
    {"I32", 32, DType::I32},      {"I64", 64, DType::I64},
    // Known but not held by mla: listed and validated, refused when read.
    {"BOOL", 8, std::nullopt},    {"U8", 8, std::nullopt},      {"I8", 8, std::nullopt},
    {"F8_E5M2", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt}, {"I16", 16, std::nullopt},
    {"U16", 16, std::nullopt},    {"U32", 32, std::nullopt},    {"U64", 64, std::nullopt},
    {"C64", 64, std::nullopt},    {"F4", 4, std::nullopt},      {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},
};
constexpr const char* kSupportedList = "F64, F32, BF16, F16, F8_E4M3, I32, I64";

const StDtype* find_st_dtype(const std::string& s) {
  for (const StDtype& d : kStDtypes)
    if (s == d.name) return &d;
  return nullptr;
}

// A name or string from a file, quoted for a one-line message: control bytes escaped, long
// strings shortened (at a UTF-8 boundary).
std::string q(std::string_view s) { return "'" + printable_line(s, 120) + "'"; }

// Arbitrary bytes (e.g. a JSON parser message quoting the file) as printable ASCII, one line.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s) {
    uint8_t u = uint8_t(c);
    if (u < 0x20 || u >= 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  return out;
}

// A JSON value from the file, short and printable.
std::string show(const json& v) {
  std::string s = printable(v.dump(-1, ' ', false, json::error_handler_t::replace));
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// "[json.exception.parse_error.101] parse error at ..." → "parse error at ...".
std::string json_message(const json::exception& e) {
  std::string_view m = e.what();
  if (!m.empty() && m[0] == '[') {
    size_t close = m.find("] ");
    if (close != std::string_view::npos) m.remove_prefix(close + 2);
  }
  return printable(m);
}

// The deepest nesting of [ and { outside strings, stopping once past `limit`. JSON nested without
// bound would overflow the stack in nlohmann's recursive dump(); a safetensors header needs 3.
int nesting_depth(const char* p, size_t n, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n && deepest <= limit; ++i) {
    const char c = p[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}
constexpr int kMaxDepth = 64;

std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

std::string errno_str() { return std::strerror(errno); }

// The bytes of a file: a read-only private mapping of the whole file (open), or a copy held in
// memory (from_bytes).
struct Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool mapped = false;
  std::vector<uint8_t> owned;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (mapped) munmap(const_cast<uint8_t*>(data), size);
  }
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads and checks one tensor entry of the header.
SafetensorsFile::Info parse_entry(const std::string& path, const std::string& name, const json& e,
                                  uint64_t data_begin, uint64_t data_size, uint64_t& begin,
                                  uint64_t& end) {
  const std::string t = q(name);
  if (!e.is_object()) fail("{}: tensor {}: entry is not an object (got {})", path, t, show(e));
  auto field = [&](const char* key) -> const json& {
    auto it = e.find(key);
    if (it == e.end()) fail("{}: tensor {}: missing \"{}\"", path, t, key);
    return *it;
  };

  const json& jd = field("dtype");
  if (!jd.is_string()) fail("{}: tensor {}: \"dtype\" is not a string (got {})", path, t, show(jd));
  const std::string& dname = jd.get_ref<const std::string&>();
  const StDtype* dt = find_st_dtype(dname);
  if (!dt) fail("{}: tensor {}: unknown dtype {}", path, t, q(dname));

  const json& js = field("shape");
  if (!js.is_array()) fail("{}: tensor {}: \"shape\" is not an array (got {})", path, t, show(js));
  SafetensorsFile::Info info;
  info.st_dtype = dname;
  info.dtype = dt->dtype;
  uint64_t numel = 1;
  for (const json& d : js) {
    if (!d.is_number_integer())
      fail("{}: tensor {}: shape {} has a dimension that is not an integer ({})", path, t,
           show(js), show(d));
    std::optional<uint64_t> u = as_u64(d);
    if (!u)
      fail("{}: tensor {}: shape {} has a negative dimension ({})", path, t, show(js), show(d));
    if (*u > uint64_t(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, *u, &numel) ||
        numel > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: tensor {}: shape {} has too many elements (overflow)", path, t, show(js));
    info.shape.push_back(int64_t(*u));
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dt->bits), &bits))
    fail("{}: tensor {}: {} × shape {} is too many bytes (overflow)", path, t, dname, show(js));
  if (bits % 8 != 0)
    fail("{}: tensor {}: {} × shape {} is not a whole number of bytes", path, t, dname, show(js));
  const uint64_t want = bits / 8;

  const json& jo = field("data_offsets");
  std::optional<uint64_t> b, en;
  if (jo.is_array() && jo.size() == 2) b = as_u64(jo[0]), en = as_u64(jo[1]);
  if (!b || !en)
    fail("{}: tensor {}: \"data_offsets\" is not two non-negative integers (got {})", path, t,
         show(jo));
  begin = *b;
  end = *en;
  if (begin > end)
    fail("{}: tensor {}: data_offsets [{}, {}] begin after they end", path, t, begin, end);
  if (end - begin != want)
    fail("{}: tensor {}: data_offsets [{}, {}] do not match dtype {} × shape {} = {} bytes", path,
         t, begin, end, dname, shape_str(info.shape), want);
  if (end > data_size)
    fail("{}: tensor {}: data_offsets [{}, {}] run past the end of the data section ({} bytes; "
         "the file is truncated or the header is wrong)", path, t, begin, end, data_size);
  info.offset = size_t(data_begin + begin);
  info.nbytes = size_t(want);
  return info;
}

}  // namespace

std::string safetensors_dtype_name(DType t) {
  for (const StDtype& d : kStDtypes)
    if (d.dtype == t) return d.name;
  fail("dtype {} has no safetensors name", dtype_name(t));
}

// ---- SafetensorsFile ----------------------------------------------------------------------------

struct SafetensorsFile::State {
  std::string path;
  std::shared_ptr<const Mapping> map;
  std::map<std::string, Info> tensors;
  std::map<std::string, std::string> metadata;
};

namespace {

// Validates the header of a whole file's bytes (`path` names it in errors) and lists its tensors
// and metadata.
void parse_file(const std::string& path, const uint8_t* bytes, uint64_t file_size,
                std::map<std::string, SafetensorsFile::Info>& tensors,
                std::map<std::string, std::string>& metadata) {
  using Info = SafetensorsFile::Info;
  if (file_size < 8)
    fail("{}: file is {} bytes, too short for the 8-byte header length", path, file_size);
  uint64_t n = 0;
  std::memcpy(&n, bytes, 8);
  if (n == 0) fail("{}: header length is 0", path);
  if (n > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the {} byte limit (not a safetensors file?)", path, n,
         kMaxHeaderBytes);
  if (n > file_size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes; truncated?)", path, n,
         file_size);
  const uint64_t data_begin = 8 + n, data_size = file_size - data_begin;

  const char* text = reinterpret_cast<const char*>(bytes + 8);
  // nlohmann stops at a NUL byte as at the end of input; valid JSON has none (strings escape it).
  if (const void* nul = std::memchr(text, 0, n))
    fail("{}: header is not valid JSON: a NUL byte at header offset {}", path,
         static_cast<const char*>(nul) - text);
  if (nesting_depth(text, n, kMaxDepth) > kMaxDepth)
    fail("{}: header nests JSON deeper than {} levels", path, kMaxDepth);
  json h;
  try {
    h = json::parse(text, text + n);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, json_message(e));
  }
  if (!h.is_object()) fail("{}: header is not a JSON object (got {})", path, show(h));

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object())
        fail("{}: \"__metadata__\" is not an object (got {})", path, show(*it));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          fail("{}: \"__metadata__\" value for key {} is not a string (got {})", path, q(m.key()),
               show(*m));
        metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    uint64_t b = 0, e = 0;
    Info info = parse_entry(path, name, *it, data_begin, data_size, b, e);
    auto [pos, _] = tensors.emplace(name, std::move(info));
    if (e > b) ranges.push_back({b, e, &pos->first});
  }

  // No two tensors may share bytes (gaps are allowed). Sorted by begin, a range overlaps some
  // earlier one iff it starts before the furthest end seen so far.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return std::tie(a.begin, a.end) <
                                                        std::tie(b.begin, b.end); });
  const Range* furthest = nullptr;
  for (const Range& r : ranges) {
    if (furthest && r.begin < furthest->end)
      fail("{}: tensors {} data_offsets [{}, {}] and {} data_offsets [{}, {}] overlap", path,
           q(*furthest->name), furthest->begin, furthest->end, q(*r.name), r.begin, r.end);
    if (!furthest || r.end > furthest->end) furthest = &r;
  }
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto s = std::make_shared<State>();
  s->path = path;

  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail("{}: cannot open: {}", path, errno_str());
  struct stat st {};
  if (fstat(fd.fd, &st) != 0) fail("{}: cannot stat: {}", path, errno_str());
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8)
    fail("{}: file is {} bytes, too short for the 8-byte header length", path, file_size);

  auto map = std::make_shared<Mapping>();
  void* p = mmap(nullptr, size_t(file_size), PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (p == MAP_FAILED) fail("{}: cannot map {} bytes: {}", path, file_size, errno_str());
  map->data = static_cast<const uint8_t*>(p);
  map->size = size_t(file_size);
  map->mapped = true;
  s->map = map;
  parse_file(path, map->data, file_size, s->tensors, s->metadata);
  return SafetensorsFile(std::move(s));
}

SafetensorsFile SafetensorsFile::from_bytes(const void* data, size_t size,
                                            const std::string& name) {
  auto s = std::make_shared<State>();
  s->path = name;
  auto map = std::make_shared<Mapping>();
  if (size) map->owned.assign(static_cast<const uint8_t*>(data),
                              static_cast<const uint8_t*>(data) + size);
  map->data = map->owned.data();
  map->size = size;
  s->map = map;
  parse_file(name, map->data, size, s->tensors, s->metadata);
  return SafetensorsFile(std::move(s));
}

const std::string& SafetensorsFile::path() const { return s_->path; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> v;
  v.reserve(s_->tensors.size());
  for (const auto& [name, _] : s_->tensors) v.push_back(name);
  return v;
}

size_t SafetensorsFile::size() const { return s_->tensors.size(); }

bool SafetensorsFile::has(const std::string& name) const { return s_->tensors.count(name) != 0; }

const SafetensorsFile::Info& SafetensorsFile::info(const std::string& name) const {
  auto it = s_->tensors.find(name);
  if (it == s_->tensors.end()) fail("{}: no tensor named {}", s_->path, q(name));
  return it->second;
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return s_->metadata;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const Info& i = info(name);
  if (!i.dtype)
    fail("{}: tensor {} has unsupported dtype {} (mla reads {})", s_->path, q(name), i.st_dtype,
         kSupportedList);
  Tensor t = Tensor::host(*i.dtype, i.shape);
  if (t.nbytes() != i.nbytes)  // cannot happen after validation; guards the memcpy regardless
    fail("{}: tensor {}: internal size mismatch", s_->path, q(name));
  if (i.nbytes) std::memcpy(t.data(), s_->map->data + i.offset, i.nbytes);
  return t;
}

Tensor SafetensorsFile::view(const std::string& name) const {
  const Info& i = info(name);
  if (!i.dtype || i.nbytes == 0) return tensor(name);  // errors, or nothing to share
  const uint8_t* p = s_->map->data + i.offset;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(*i.dtype) != 0) return tensor(name);
  // Aliasing shared_ptr: owns the mapping, points at the tensor's bytes.
  std::shared_ptr<void> storage(s_->map, const_cast<uint8_t*>(p));
  return Tensor(*i.dtype, i.shape, Platform::CPU, std::move(storage));
}

// ---- Checkpoint ---------------------------------------------------------------------------------

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  const fs::path p(path);
  fs::path index, single;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json", ec))
      index = p / "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors", ec))
      single = p / "model.safetensors";
    else
      fail("{}: neither model.safetensors.index.json nor model.safetensors is in this folder",
           path);
  } else if (fs::exists(p, ec)) {
    std::string fname = p.filename().string();
    if (fname.size() >= 11 && fname.ends_with(".index.json"))
      index = p;
    else
      single = p;
  } else {
    fail("{}: no such file or folder", path);
  }

  if (!single.empty()) {
    c.files_.push_back(SafetensorsFile::open(single.string()));
    for (const std::string& name : c.files_[0].names()) c.where_[name] = 0;
    return c;
  }

  // The index: {"metadata": {...}, "weight_map": {tensor name: shard file name}}.
  const std::string ipath = index.string();
  const fs::path dir = index.parent_path();
  json j;
  {
    std::ifstream in(index, std::ios::binary);
    if (!in) fail("{}: cannot open: {}", ipath, errno_str());
    std::stringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail("{}: cannot read: {}", ipath, errno_str());
    const std::string text = ss.str();
    if (text.find('\0') != std::string::npos)
      fail("{}: not valid JSON: it holds a NUL byte", ipath);
    if (nesting_depth(text.data(), text.size(), kMaxDepth) > kMaxDepth)
      fail("{}: JSON nests deeper than {} levels", ipath, kMaxDepth);
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", ipath, json_message(e));
    }
  }
  if (!j.is_object()) fail("{}: not a JSON object (got {})", ipath, show(j));
  auto wm = j.find("weight_map");
  if (wm == j.end()) fail("{}: missing \"weight_map\"", ipath);
  if (!wm->is_object()) fail("{}: \"weight_map\" is not an object (got {})", ipath, show(*wm));

  std::map<std::string, std::string> shard_of;  // tensor → shard, as the index says
  std::map<std::string, std::string> first_use;  // shard → a tensor naming it (for errors)
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string())
      fail("{}: weight_map entry {} is not a string (got {})", ipath, q(it.key()), show(*it));
    const std::string& shard = it->get_ref<const std::string&>();
    const fs::path sp(shard);
    bool escapes = shard.empty() || sp.is_absolute();
    for (const fs::path& part : sp) escapes = escapes || part == "..";
    if (escapes)
      fail("{}: weight_map entry {} names shard {}, which is not a file inside the folder", ipath,
           q(it.key()), q(shard));
    shard_of[it.key()] = shard;
    first_use.emplace(shard, it.key());
  }

  std::map<std::string, size_t> shard_index;  // shard name → index into files_
  for (const auto& [shard, tensor] : first_use) {
    const fs::path sp = dir / shard;
    if (!fs::exists(sp, ec))
      fail("{}: shard {} (holding tensor {}) does not exist", ipath, q(shard), q(tensor));
    shard_index[shard] = c.files_.size();
    c.files_.push_back(SafetensorsFile::open(sp.string()));
  }
  for (size_t f = 0; f < c.files_.size(); ++f)
    for (const std::string& name : c.files_[f].names()) {
      auto [it, fresh] = c.where_.emplace(name, f);
      if (!fresh)
        fail("{}: tensor {} is in two shards: {} and {}", ipath, q(name),
             c.files_[it->second].path(), c.files_[f].path());
    }
  for (const auto& [name, shard] : shard_of) {
    const SafetensorsFile& f = c.files_[shard_index.at(shard)];
    if (!f.has(name)) {
      auto other = c.where_.find(name);
      if (other == c.where_.end())
        fail("{}: weight_map maps tensor {} to shard {}, which lacks it", ipath, q(name),
             q(shard));
      fail("{}: weight_map maps tensor {} to shard {}, which lacks it (it is in {})", ipath,
           q(name), q(shard), c.files_[other->second].path());
    }
  }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> v;
  v.reserve(where_.size());
  for (const auto& [name, _] : where_) v.push_back(name);
  return v;
}

const SafetensorsFile& Checkpoint::file(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("{}: no tensor named {} in the checkpoint", path_, q(name));
  return files_[it->second];
}

const SafetensorsFile::Info& Checkpoint::info(const std::string& name) const {
  return file(name).info(name);
}

Tensor Checkpoint::tensor(const std::string& name) const { return file(name).tensor(name); }

Tensor Checkpoint::view(const std::string& name) const { return file(name).view(name); }

std::optional<Tensor> Checkpoint::find(const std::string& name) const {
  if (!has(name)) return std::nullopt;
  return tensor(name);
}

// ---- writing ------------------------------------------------------------------------------------

namespace {

// The temp file of an atomic write: removed on destruction unless committed.
struct TempFile {
  std::string path;
  int fd = -1;
  bool committed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!committed) ::unlink(path.c_str());
  }
};

void write_all(const std::string& path, int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("{}: cannot write: {}", path, errno_str());
    }
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Check everything and build the header before touching the disk.
  struct Item {
    const std::string* name;
    const Tensor* t;
  };
  std::vector<Item> items;
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail("{}: a tensor cannot be named \"__metadata__\"", path);
    if (!seen.insert(name).second) fail("{}: tensor {} is given twice", path, q(name));
    if (!t.defined()) fail("{}: tensor {} is undefined", path, q(name));
    if (t.platform() != Platform::CPU)
      fail("{}: tensor {} is on {}, not the host", path, q(name), platform_name(t.platform()));
    if (t.dtype() == DType::F8_E4M3FNUZ)
      fail("{}: tensor {} has dtype {}, which safetensors cannot name", path, q(name),
           dtype_name(t.dtype()));
    items.push_back({&name, &t});
  }
  // Larger elements first, so that every tensor starts aligned to its element size.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    size_t sa = dtype_size(a.t->dtype()), sb = dtype_size(b.t->dtype());
    return sa != sb ? sa > sb : *a.name < *b.name;
  });

  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Item& it : items) {
    const uint64_t n = it.t->nbytes();
    h[*it.name] = {{"dtype", safetensors_dtype_name(it.t->dtype())},
                   {"shape", it.t->shape()},
                   {"data_offsets", json::array({offset, offset + n})}};
    offset += n;
  }
  std::string header;
  try {
    header = h.dump();
  } catch (const json::exception& e) {
    fail("{}: cannot write the header: {}", path, json_message(e));
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeaderBytes)
    fail("{}: header would be {} bytes, over the {} byte limit", path, header.size(),
         kMaxHeaderBytes);

  TempFile tmp{path + ".tmp"};
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0) fail("{}: cannot create {}: {}", path, tmp.path, errno_str());
  const uint64_t n = header.size();
  write_all(tmp.path, tmp.fd, &n, 8);
  write_all(tmp.path, tmp.fd, header.data(), header.size());
  for (const Item& it : items) write_all(tmp.path, tmp.fd, it.t->data(), it.t->nbytes());
  if (::fsync(tmp.fd) != 0) fail("{}: cannot fsync: {}", tmp.path, errno_str());
  const int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) fail("{}: cannot close: {}", tmp.path, errno_str());
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    fail("{}: cannot rename {} to it: {}", path, tmp.path, errno_str());
  tmp.committed = true;

  // Make the rename itself durable; best effort, the file is complete either way.
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  Fd dfd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dfd.fd >= 0) (void)::fsync(dfd.fd);
}

}  // namespace mla
