// comm::threads with only the required collectives: no all_to_all, split, nonblocking calls or labels, for the
// tests of what the library does over a backend that lacks an optional capability.
#pragma once

#include <cstddef>

#include "zero/comm/backends/threads.hpp"

namespace zero_test {

class plain_threads {
 public:
  using system = zero::comm::threads::system;
  explicit plain_threads(zero::comm::threads& t) : t_(&t) {}
  int rank() const { return t_->rank(); }
  int size() const { return t_->size(); }
  template <class T>
  void all_reduce(const T* s, T* r, std::size_t n, zero::reduce_op op) { t_->all_reduce(s, r, n, op); }
  template <class T>
  void reduce_scatter(const T* s, T* r, std::size_t n, zero::reduce_op op) { t_->reduce_scatter(s, r, n, op); }
  template <class T>
  void all_gather(const T* s, T* r, std::size_t n) { t_->all_gather(s, r, n); }
  template <class T>
  void broadcast(const T* s, T* r, std::size_t n, int root) { t_->broadcast(s, r, n, root); }
  void barrier() { t_->barrier(); }

 private:
  zero::comm::threads* t_;
};

}  // namespace zero_test
