// expect-success
#include "zero/zero.hpp"

// A backend with the settings check's std::int64_t all-gather but no std::int64_t reductions: the
// engine compiles without the reproducible mode's reducer (which would need them) and refuses the
// mode at construction; every other option is served.
struct no_int64_reductions {
  using system = zero::sys::host;
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void all_reduce(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void reduce_scatter(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>)
  void all_gather(const T*, T*, std::size_t) {}
  template <class T> requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void broadcast(const T*, T*, std::size_t, int) {}
  void barrier() {}
};
static_assert(!zero::CommBackendForReproducible<no_int64_reductions>);
template class zero::engine<zero::stage1, no_int64_reductions, zero::optim::adamw>;
