// expect: concept zero::CommBackend|CommBackend<Comm>
// expect: required expression .c\.all_gather
#include "zero/zero.hpp"

// A backend that forgot all_gather.
struct no_all_gather {
  using system = zero::sys::host;
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> void all_reduce(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> void reduce_scatter(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> void broadcast(const T*, T*, std::size_t, int) {}
  void barrier() {}
};
static_assert(zero::CommBackend<no_all_gather>);
