// expect: CommBackend<Comm>
// expect: required expression .c\.barrier\(\)
#include "zero/zero.hpp"

// The engine states its requirements: a backend without barrier() is refused at the engine's door.
struct no_barrier {
  using system = zero::sys::host;
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> void all_reduce(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> void reduce_scatter(const T*, T*, std::size_t, zero::reduce_op) {}
  template <class T> void all_gather(const T*, T*, std::size_t) {}
  template <class T> void broadcast(const T*, T*, std::size_t, int) {}
};
zero::engine<zero::stage3, no_barrier, zero::optim::adamw>* e = nullptr;
