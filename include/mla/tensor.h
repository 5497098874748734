// mla/tensor.h — a typed, shaped, contiguous buffer living on one platform.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "mla/dtype.h"
#include "mla/platform.h"

namespace mla {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[4, 16, 576]"

// Row-major and contiguous. Copying a Tensor shares its storage (like a handle); use clone() for a
// deep copy. Host tensors are allocated here; device tensors are made by a platform's Ops.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, Platform where, std::shared_ptr<void> storage);

  // A zero-filled host tensor.
  static Tensor host(DType dtype, Shape shape);
  // A host tensor holding the values (converted to dtype).
  static Tensor host_from(const std::vector<double>& values, DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int rank() const { return int(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  Platform platform() const { return where_; }
  bool defined() const { return storage_ != nullptr; }

  void* data() const { return storage_.get(); }
  template <typename T>
  T* ptr() const { return static_cast<T*>(storage_.get()); }

  // Same storage, new shape with the same element count.
  Tensor reshaped(Shape shape) const;
  // Rows [begin, end) of the first dimension: a view sharing the storage. Throws Error when outside.
  Tensor rows(int64_t begin, int64_t end) const;

  // Host only: element access through double, a deep copy, a conversion to another dtype.
  double at(size_t i) const { return load_as_double(data(), dtype_, i); }
  void set(size_t i, double v) { store_from_double(data(), dtype_, i, v); }
  std::vector<double> to_doubles() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;

 private:
  DType dtype_ = DType::F32;
  Shape shape_;
  Platform where_ = Platform::CPU;
  std::shared_ptr<void> storage_;
};

}  // namespace mla
