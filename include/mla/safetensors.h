// mla/safetensors.h — reading and writing safetensors files and HF checkpoint folders.
//
// The format: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON header, then the data section.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section), plus an optional "__metadata__" object of string → string.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mla/dtype.h"
#include "mla/tensor.h"

namespace mla {

// The safetensors dtype name of an mla dtype ("F32", "BF16", "F8_E4M3", ...); throws Error for
// F8_E4M3FNUZ, which safetensors cannot name.
std::string safetensors_dtype_name(DType t);

// A read-only, memory-mapped safetensors file. The whole header is validated on open, so every
// tensor listed can be read without further checks. Copies share the mapping (cheap handles);
// the mapping lives as long as any copy or any view() tensor. As with any mapping, the file must
// not be truncated while mapped (reads would fault); it is replaced safely by a rename, as
// write_safetensors does.
//
// Dtypes mla holds: F64, F32, BF16, F16, F8_E4M3 (→ F8_E4M3FN), I32, I64. Other safetensors
// dtypes (BOOL, U8, I8, I16, U16, U32, U64, F8_E5M2, F8_E8M0, C64, F4, F6_*) are understood well
// enough to validate and list; reading such a tensor throws Error ("unsupported dtype").
class SafetensorsFile {
 public:
  struct Info {
    std::string st_dtype;        // as the file spells it: "BF16", "F8_E4M3", "U8", ...
    std::optional<DType> dtype;  // nullopt when mla cannot hold st_dtype
    Shape shape;
    size_t offset = 0;  // absolute byte offset of the tensor's data in the file
    size_t nbytes = 0;
  };

  // Throws Error (one line: the path and the problem) if the file cannot be read or its header
  // is invalid in any way: lengths, JSON, UTF-8, entry fields, dims, dtypes, offsets, overlaps.
  static SafetensorsFile open(const std::string& path);
  // The same from bytes in memory (copied and kept); `name` stands for the path in errors and
  // path(). For data that never was a file, and for fuzzing the parser.
  static SafetensorsFile from_bytes(const void* data, size_t size,
                                    const std::string& name = "<memory>");

  const std::string& path() const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const;                     // number of tensors
  bool has(const std::string& name) const;
  const Info& info(const std::string& name) const;  // throws Error naming an absent tensor
  const std::map<std::string, std::string>& metadata() const;

  // A host tensor owning a copy of the bytes (writable, aligned).
  Tensor tensor(const std::string& name) const;
  // Zero-copy: a host tensor pointing into the mapping, which it keeps alive. READ-ONLY — writing
  // through it faults. A tensor whose data is not aligned to its element size (or has no
  // elements) comes back as a copy instead.
  Tensor view(const std::string& name) const;

 private:
  struct State;
  explicit SafetensorsFile(std::shared_ptr<const State> s) : s_(std::move(s)) {}
  std::shared_ptr<const State> s_;
};

// A checkpoint: a folder holding model.safetensors.index.json ({"weight_map": {name: shard}}) and
// its shards, or a folder holding model.safetensors, or a path to one .safetensors file or to an
// index file. Every shard is opened (and validated) on open. Errors name the index or the shard.
// names() is the union over the shards; a name in two shards is an error, as is an index entry
// pointing to a shard that lacks the tensor or to a shard file that does not exist.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return where_.size(); }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // The file holding `name`; throws Error naming an absent tensor.
  const SafetensorsFile& file(const std::string& name) const;
  const SafetensorsFile::Info& info(const std::string& name) const;
  Tensor tensor(const std::string& name) const;  // a copy, as SafetensorsFile::tensor
  Tensor view(const std::string& name) const;    // read-only zero-copy, as SafetensorsFile::view
  // tensor(name), or nullopt when absent (fits a TensorLookup, see mla/weights.h).
  std::optional<Tensor> find(const std::string& name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }  // by file name

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name → index into files_
};

// Writes host tensors (any dtype but F8_E4M3FNUZ) to `path` atomically: the bytes go to
// path + ".tmp", are fsynced, and the temp file is renamed over `path`. On any failure the temp
// file is removed and Error thrown; `path` is never left partial (a previous file stays intact).
// Data is laid out by element size (largest first), then by name, so every tensor's data is
// aligned to its element size; the header is padded with spaces to a multiple of 8 bytes.
// Names must be distinct, valid UTF-8 and not "__metadata__".
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mla
