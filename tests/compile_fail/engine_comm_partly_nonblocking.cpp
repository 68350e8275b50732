// expect: overlap: the backend names part of the nonblocking interface
#include <cstddef>

#include "zero/zero.hpp"

// The engine itself refuses a backend that names part of the nonblocking interface (here wait's
// request and two starts, the third misspelled), which would otherwise run with overlap off.
class almost_nonblocking {
 public:
  using system = zero::sys::host;
  struct request {};
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> void all_reduce(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> void reduce_scatter(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> void all_gather(const T*, T*, std::size_t) {}
  template <class T> void broadcast(const T*, T*, std::size_t, int) {}
  void barrier() {}
  template <class T> request start_all_reduce(const T*, T*, std::size_t, zero::reduce_op) { return {}; }
  template <class T> request start_reduce_scatter(const T*, T*, std::size_t, zero::reduce_op) { return {}; }
  template <class T> request start_allgather(const T*, T*, std::size_t) { return {}; }
  void wait(request&) {}
};
static_assert(!zero::comm::nonblocking<almost_nonblocking>);
template class zero::engine<zero::stage3, almost_nonblocking, zero::optim::sgd>;
