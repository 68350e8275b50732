// expect: the settings agreement check at construction all-gathers std::int64_t words
#include "zero/zero.hpp"

// A backend that moves float and double only (what CommBackend checks): refused at the engine's
// instantiation with a message naming the feature that needs std::int64_t, not deep in comm::counted.
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
static_assert(zero::CommBackendFor<float_and_double_only, float>);
template class zero::engine<zero::stage1, float_and_double_only, zero::optim::adamw>;
