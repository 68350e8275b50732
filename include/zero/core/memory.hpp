// Memory accounting: every byte the engine holds is allocated through here, by category, with peaks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <utility>

#include "zero/error.hpp"

namespace zero {

// offload: host memory an offload tier holds where host memory is the system's own (the CPU
// systems): the host tier's arrays, the disk tier's slice buffers and checksums (offload/state_store.hpp).
// snapshot: host memory holding a copy of the state for an asynchronous checkpoint save while its
// writer runs (checkpoint/save_async.hpp), where host memory is the system's own.
enum class mem_category : int { params, grads, master, optimizer_states, transient, offload, snapshot };
inline constexpr int mem_category_count = 7;

inline const char* to_string(mem_category c) {
  switch (c) {
    case mem_category::params: return "params";
    case mem_category::grads: return "grads";
    case mem_category::master: return "master";
    case mem_category::optimizer_states: return "optimizer_states";
    case mem_category::transient: return "transient";
    case mem_category::offload: return "offload";
    case mem_category::snapshot:
      return "snapshot";
  }
  return "?";
}

// Bytes currently held and the most ever held, per category and in total.
struct memory_report {
  std::array<std::size_t, mem_category_count> current{}, peak{};
  std::size_t peak_total = 0;
  // Blocks held now per category, as buffer<T, System> allocates them, each one contiguous: how
  // fragmented a category is. The engine's model states are a fixed number of flat arrays whatever the
  // model's units and tensors (params: 1, or more for stage 3's persistent copy and hpZ's secondary;
  // grads: 1 or 2; master: 0 or 1; optimizer_states: one per slot). The offload tier's host memory is
  // accounted as one sum and counts no blocks here.
  std::array<std::size_t, mem_category_count> blocks{};

  std::size_t bytes(mem_category c) const { return current[static_cast<int>(c)]; }
  std::size_t peak_bytes(mem_category c) const { return peak[static_cast<int>(c)]; }
  std::size_t block_count(mem_category c) const { return blocks[static_cast<int>(c)]; }
  // Persistent model states: what the paper's equations count (transient buffers excluded).
  std::size_t model_state_bytes() const {
    return bytes(mem_category::params) + bytes(mem_category::grads) + bytes(mem_category::master) +
           bytes(mem_category::optimizer_states);
  }
};

// What a memory space can give, as a system reports it (System::available(), where it has one).
struct memory_info {
  std::uint64_t free = 0;   // bytes that can be allocated now
  std::uint64_t total = 0;  // the space's size
  int sharers = 1;          // ranks of this process that draw on the same memory (ranks sharing one GPU)
  std::string space;        // what the memory is, for messages ("CUDA device 0")
};

class memory_accounting {
 public:
  // Who holds the accounted memory (for messages) and the most bytes it may hold (0: no limit).
  void configure(int rank, std::size_t limit_bytes) {
    rank_ = rank;
    limit_ = limit_bytes;
  }
  std::size_t limit() const { return limit_; }
  std::size_t total() const {
    std::size_t t = 0;
    for (auto b : r_.current) t += b;
    return t;
  }

  // Throws error_kind::out_of_memory when `bytes` more would exceed the limit. Called by buffer
  // before it allocates.
  void admit(mem_category c, std::size_t bytes) const {
    if (limit_ == 0 || total() + bytes <= limit_) return;
    fail(error_kind::out_of_memory, who(), "allocating ", bytes, " bytes of ", to_string(c), " would hold ",
         total() + bytes, " bytes, over the memory_limit_bytes budget of ", limit_, " bytes; held now: ", held());
  }
  // Throws error_kind::out_of_memory for an allocation the system refused, naming what was asked.
  [[noreturn]] void allocation_failed(mem_category c, std::size_t bytes, const std::string& cause) const {
    fail(error_kind::out_of_memory, who(), "allocating ", bytes, " bytes of ", to_string(c), " failed (", cause,
         "); held now: ", held());
  }

  void add(mem_category c, std::size_t bytes) {
    auto i = static_cast<int>(c);
    r_.current[i] += bytes;
    if (r_.current[i] > r_.peak[i]) r_.peak[i] = r_.current[i];
    std::size_t total = 0;
    for (auto b : r_.current) total += b;
    if (total > r_.peak_total) r_.peak_total = total;
  }
  void remove(mem_category c, std::size_t bytes) { r_.current[static_cast<int>(c)] -= bytes; }
  // A block of category c allocated or freed (buffer does this beside add and remove).
  void add_block(mem_category c) { ++r_.blocks[static_cast<int>(c)]; }
  void remove_block(mem_category c) { --r_.blocks[static_cast<int>(c)]; }
  const memory_report& report() const { return r_; }

 private:
  std::string who() const {
    return rank_ >= 0 ? detail::concat("rank ", rank_, ": out of memory: ") : std::string("out of memory: ");
  }
  std::string held() const {
    std::string s = std::to_string(total()) + " bytes (";
    for (int i = 0; i < mem_category_count; ++i)
      s += detail::concat(i ? ", " : "", to_string(static_cast<mem_category>(i)), " ", r_.current[i]);
    return s + ")";
  }

  memory_report r_;
  int rank_ = -1;
  std::size_t limit_ = 0;
};

// Asks a buffer for memory its owner writes in full before reading, instead of zeros.
struct uninitialized_t {
  explicit uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

// An owning, typed, zero-filled allocation in System's memory space, counted under one category.
// Move-only; the accounting it reports to must outlive it.
template <class T, class System>
class buffer {
 public:
  buffer() = default;
  // Not zero-filled: for a buffer that is written in full before it is read (a fill is a pass over
  // memory the writer makes anyway).
  buffer(std::size_t n, mem_category c, memory_accounting& acct, uninitialized_t) : buffer(n, c, acct, false) {}
  // An allocation the budget or the system refuses throws error_kind::out_of_memory naming the
  // category and the bytes asked (the accounting adds the rank): std::bad_alloc from a host
  // allocator, or an out_of_memory zero::error from a device one.
  buffer(std::size_t n, mem_category c, memory_accounting& acct) : buffer(n, c, acct, true) {}
  buffer(buffer&& o) noexcept { swap(o); }
  buffer& operator=(buffer&& o) noexcept {
    buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() { reset(); }

  void reset() noexcept {
    if (acct_ && data_) {
      System::deallocate(data_, n_ * sizeof(T));
      acct_->remove(cat_, n_ * sizeof(T));
      acct_->remove_block(cat_);
    }
    data_ = nullptr;
    n_ = 0;
  }
  T* data() const { return data_; }
  std::size_t size() const { return n_; }
  bool empty() const { return data_ == nullptr; }
  mem_category category() const { return cat_; }

 private:
  buffer(std::size_t n, mem_category c, memory_accounting& acct, bool zero) : n_(n), cat_(c), acct_(&acct) {
    const std::size_t bytes = n * sizeof(T);
    acct.admit(c, bytes);
    try {
      data_ = static_cast<T*>(System::allocate(bytes));
    } catch (const std::bad_alloc& e) {
      acct.allocation_failed(c, bytes, e.what());
    } catch (const error& e) {
      if (e.kind() != error_kind::out_of_memory) throw;
      acct.allocation_failed(c, bytes, e.what());
    }
    if (zero) System::fill_zero(data_, n * sizeof(T));
    acct_->add(cat_, n * sizeof(T));
    if (data_) acct_->add_block(cat_);
  }
  void swap(buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
    std::swap(cat_, o.cat_);
    std::swap(acct_, o.acct_);
  }
  T* data_ = nullptr;
  std::size_t n_ = 0;
  mem_category cat_ = mem_category::transient;
  memory_accounting* acct_ = nullptr;
};

}  // namespace zero
