// Tensor handles that share the caller's reference instead of taking one: copying an at::Tensor
// whose TensorImpl has a Python object takes the GIL (PyObject preservation), per tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace npu_dispatch {

class BorrowedTensors {
 public:
  BorrowedTensors() = default;
  BorrowedTensors(const BorrowedTensors&) = delete;
  BorrowedTensors& operator=(const BorrowedTensors&) = delete;
  ~BorrowedTensors() { clear(); }

  void reserve(size_t n) { v_.reserve(n); }
  // `t` must outlive this list (or the next clear()).
  void push_back(const at::Tensor& t) { v_.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t)); }
  void clear() {
    for (auto& t : v_) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
    v_.clear();
  }
  bool empty() const { return v_.empty(); }
  size_t size() const { return v_.size(); }
  at::TensorList list() const { return v_; }
  operator at::TensorList() const { return v_; }

 private:
  std::vector<at::Tensor> v_;
};

}  // namespace npu_dispatch
