// expect: the comm backend has no all_reduce, reduce_scatter or all_gather for the precision policy's comm_type
#include "zero/zero.hpp"

// A backend that moves float and double only (what CommBackend checks), asked to run a bf16 engine.
struct float_and_double_only {
  using system = zero::sys::host;
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void all_reduce(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void reduce_scatter(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void all_gather(const T*, T*, std::size_t) {}
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void broadcast(const T*, T*, std::size_t, int) {}
  void barrier() {}
};
static_assert(zero::CommBackend<float_and_double_only>);
template class zero::engine<zero::stage3, float_and_double_only, zero::optim::adamw, zero::precision::bf16>;
