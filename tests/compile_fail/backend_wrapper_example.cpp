// expect-success
// The wrapper of docs/extending.md ("A backend built on another"), compiled as the doc shows it.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "zero/zero.hpp"

// A backend built on another: every collective forwarded, each optional capability forwarded only
// where the inner backend has it, and split wrapping the inner communicator's split.
template <zero::CommBackend Inner>
class logging_backend {
 public:
  using system = typename Inner::system;
  explicit logging_backend(Inner& inner) : inner_(&inner) {}

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  std::uint64_t calls() const { return calls_; }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, zero::reduce_op op) {
    ++calls_;
    inner_->all_reduce(send, recv, count, op);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, zero::reduce_op op) {
    ++calls_;
    inner_->reduce_scatter(send, recv, count, op);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    ++calls_;
    inner_->all_gather(send, recv, count);
  }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ++calls_;
    inner_->broadcast(send, recv, count, root);
  }
  void barrier() { inner_->barrier(); }

  // Optional capabilities: present exactly where the inner backend has them.
  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count)
    requires zero::comm::has_all_to_all<Inner>
  {
    ++calls_;
    inner_->all_to_all(send, recv, count);
  }
  zero::comm::call_label set_call_label(zero::comm::call_label l)
    requires zero::comm::labels_calls<Inner>
  {
    return inner_->set_call_label(l);
  }
  // A collective on this communicator: the inner backend splits, and the new wrapper owns the result.
  std::unique_ptr<logging_backend> split(int color)
    requires zero::comm::splittable<Inner>
  {
    std::unique_ptr<Inner> sub = inner_->split(color);
    auto wrapped = std::make_unique<logging_backend>(*sub);
    wrapped->owned_ = std::move(sub);
    return wrapped;
  }

 private:
  Inner* inner_;
  std::unique_ptr<Inner> owned_;  // the communicator a split made, destroyed with its wrapper
  std::uint64_t calls_ = 0;
};

using threads_logged = logging_backend<zero::comm::threads>;
static_assert(zero::CommBackendForEngine<threads_logged, zero::bf16>);
static_assert(zero::comm::check_all_to_all<threads_logged>());
static_assert(zero::comm::check_byte_all_gather<threads_logged>());
static_assert(zero::comm::check_split<threads_logged>());
static_assert(zero::comm::check_call_labels<threads_logged>());
static_assert(!zero::comm::names_nonblocking_member<threads_logged>);  // runs blocking, by design
template class zero::engine<zero::stage3, threads_logged, zero::optim::adamw, zero::precision::bf16>;
