// Host tensors.
#include "mla/tensor.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "mla/error.h"

namespace mla {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor::Tensor(DType dtype, Shape shape, Platform where, std::shared_ptr<void> storage)
    : dtype_(dtype), shape_(std::move(shape)), where_(where), storage_(std::move(storage)) {}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::host(DType dtype, Shape shape) {
  for (int64_t d : shape)
    if (d < 0) fail("tensor shape {} has a negative dimension", shape_str(shape));
  // Element and byte counts, refused if any partial product overflows (numel() is int64).
  uint64_t n = 1, bytes = 0;
  bool overflow = false;
  for (int64_t d : shape) overflow |= __builtin_mul_overflow(n, uint64_t(d), &n) || n > INT64_MAX;
  if (overflow || __builtin_mul_overflow(n, uint64_t(dtype_size(dtype)), &bytes))
    fail("tensor shape {} of {} is too large to allocate", shape_str(shape), dtype_name(dtype));
  bytes = std::max<uint64_t>(bytes, 1);
  void* p = std::calloc(size_t(bytes), 1);
  if (!p) fail("out of host memory allocating {} bytes for a tensor {}", bytes, shape_str(shape));
  return Tensor(dtype, std::move(shape), Platform::CPU, std::shared_ptr<void>(p, std::free));
}

Tensor Tensor::host_from(const std::vector<double>& values, DType dtype, Shape shape) {
  Tensor t = host(dtype, std::move(shape));
  if (int64_t(values.size()) != t.numel())
    fail("host_from: {} values for shape {}", values.size(), shape_str(t.shape()));
  for (size_t i = 0; i < values.size(); ++i) t.set(i, values[i]);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (rank() < 1 || begin < 0 || end < begin || end > dim(0))
    fail("rows [{}, {}) are outside a tensor of shape {}", begin, end, shape_str(shape_));
  Shape s = shape_;
  s[0] = end - begin;
  const size_t row_bytes = dim(0) == 0 ? 0 : nbytes() / size_t(dim(0));
  return Tensor(dtype_, std::move(s), where_,
                std::shared_ptr<void>(storage_, static_cast<char*>(storage_.get()) + size_t(begin) * row_bytes));
}

Tensor Tensor::reshaped(Shape shape) const {
  Tensor t(dtype_, std::move(shape), where_, storage_);
  if (t.numel() != numel())
    fail("cannot reshape {} to {}", shape_str(shape_), shape_str(t.shape_));
  return t;
}

std::vector<double> Tensor::to_doubles() const {
  if (where_ != Platform::CPU) fail("to_doubles needs a host tensor");
  std::vector<double> v(static_cast<size_t>(numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = at(i);
  return v;
}

Tensor Tensor::clone() const {
  if (where_ != Platform::CPU) fail("clone needs a host tensor");
  Tensor t = host(dtype_, shape_);
  std::memcpy(t.data(), data(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor t = host(dtype, shape_);
  convert_elements(data(), dtype_, t.data(), dtype, size_t(numel()));
  return t;
}

}  // namespace mla
