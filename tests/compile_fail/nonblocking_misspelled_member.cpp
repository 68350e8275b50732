// expect: check_nonblocking: no member start_all_gather\(const T\* send, T\* recv, std::size_t count\)
#include <cstddef>

#include "zero/comm/nonblocking.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/sys/host.hpp"

// A backend meant to overlap whose start_all_gather is misspelled: without the check it would pass
// CommBackend, fail comm::nonblocking, and run every collective blocking without a word.
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
static_assert(zero::CommBackend<almost_nonblocking>);
static_assert(zero::comm::check_nonblocking<almost_nonblocking>());
