// tensor_view and unit_view: non-owning views of one tensor and of one unit's tensors, looked up by name.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/error.hpp"

namespace zero {

template <class T>
class tensor_view {
 public:
  tensor_view(T* data, const tensor_spec& spec) : data_(data), spec_(&spec) {}
  T* data() const { return data_; }
  std::size_t size() const { return spec_->numel; }
  const std::vector<std::size_t>& shape() const { return spec_->shape; }
  const std::string& name() const { return spec_->name; }
  std::span<T> span() const { return {data_, spec_->numel}; }
  T& operator[](std::size_t i) const { return data_[i]; }
  T* begin() const { return data_; }
  T* end() const { return data_ + spec_->numel; }

 private:
  T* data_;
  const tensor_spec* spec_;
};

// The tensors of one unit laid over a flat buffer holding the unit's padded extent.
template <class T>
class unit_view {
 public:
  unit_view(T* data, const unit_spec& spec, const unit_layout& layout, int rank)
      : data_(data), spec_(&spec), layout_(&layout), rank_(rank) {}

  tensor_view<T> operator[](std::string_view tensor) const {
    for (std::size_t i = 0; i < spec_->tensors.size(); ++i)
      if (spec_->tensors[i].name == tensor) return at(i);
    std::string names;
    for (const auto& t : spec_->tensors) names += (names.empty() ? "" : ", ") + t.name;
    fail(error_kind::invalid_argument, "rank ", rank_, ": unit '", spec_->name, "' has no tensor '", tensor,
         "' (it has: ", names, ")");
  }
  tensor_view<T> at(std::size_t i) const {
    ZERO_CHECK(i < spec_->tensors.size(), invalid_argument, "rank ", rank_, ": unit '", spec_->name,
               "' has ", spec_->tensors.size(), " tensors, index ", i, " requested");
    return tensor_view<T>(data_ + layout_->tensors[i].begin, spec_->tensors[i]);
  }
  std::size_t num_tensors() const { return spec_->tensors.size(); }
  T* data() const { return data_; }
  std::size_t size() const { return layout_->numel; }  // unpadded
  const unit_spec& spec() const { return *spec_; }

 private:
  T* data_;
  const unit_spec* spec_;
  const unit_layout* layout_;
  int rank_;
};

}  // namespace zero
