// offload::host_block: host memory for state kept off the system (pinned where the system pins), counted in the
// engine's accounting.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "zero/core/host_pages.hpp"
#include "zero/core/memory.hpp"
#include "zero/offload/state_file.hpp"

namespace zero::offload {

// Bytes held in an engine's memory accounting under one category while it lives (none without an
// accounting). Given the engine's lifetime token, it leaves the accounting alone once the engine is
// gone: a block that outlives its engine (a checkpoint snapshot in a saver destroyed after it)
// frees its memory without touching freed accounting.
class accounted {
 public:
  accounted() = default;
  accounted(memory_accounting* acct, std::size_t bytes, mem_category category = mem_category::offload,
            std::weak_ptr<const void> owner = {})
      : acct_(acct), bytes_(bytes), category_(category), owner_(std::move(owner)), watched_(!owner_.expired()) {
    if (!acct_) return;
    acct_->admit(category_, bytes_);
    acct_->add(category_, bytes_);
  }
  accounted(accounted&& o) noexcept
      : acct_(std::exchange(o.acct_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)),
        category_(o.category_),
        owner_(std::move(o.owner_)),
        watched_(o.watched_) {}
  accounted& operator=(accounted&& o) noexcept {
    accounted t(std::move(o));
    std::swap(acct_, t.acct_);
    std::swap(bytes_, t.bytes_);
    std::swap(category_, t.category_);
    std::swap(owner_, t.owner_);
    std::swap(watched_, t.watched_);
    return *this;
  }
  accounted(const accounted&) = delete;
  accounted& operator=(const accounted&) = delete;
  ~accounted() {
    if (acct_ && !(watched_ && owner_.expired())) acct_->remove(category_, bytes_);
  }

 private:
  memory_accounting* acct_ = nullptr;
  std::size_t bytes_ = 0;
  mem_category category_ = mem_category::offload;
  std::weak_ptr<const void> owner_;
  bool watched_ = false;
};

// Host memory aligned for direct I/O, zero-filled (unless the caller writes all of it first), and
// pinned (page-locked) where the system can pin it (System::allocate_pinned: sys::cuda), so that
// device copies run at full speed. Counted in the accounted `account()` returns before it is allocated.
template <class System>
class host_block {
 public:
  host_block() = default;
  explicit host_block(std::size_t bytes, memory_accounting* acct = nullptr)
      : host_block(bytes, [&] { return accounted(acct, bytes); }) {}
  template <class Account>
  requires std::is_invocable_r_v<accounted, Account> host_block(std::size_t bytes, Account&& account,
                                                                bool zero_filled = true)
      : bytes_(bytes) {
    if (bytes == 0) return;
    held_ = account();
    if constexpr (requires { System::allocate_pinned(bytes); }) {
      p_ = System::allocate_pinned(bytes);
      pinned_ = true;
    } else {
      p_ = host_pages::allocate(bytes, io_alignment);
    }
    if (zero_filled) std::memset(p_, 0, bytes);
  }
  host_block(host_block&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)),
        pinned_(o.pinned_),
        held_(std::move(o.held_)) {}
  host_block& operator=(host_block&& o) noexcept {
    host_block t(std::move(o));
    std::swap(p_, t.p_);
    std::swap(bytes_, t.bytes_);
    std::swap(pinned_, t.pinned_);
    std::swap(held_, t.held_);
    return *this;
  }
  host_block(const host_block&) = delete;
  host_block& operator=(const host_block&) = delete;
  ~host_block() {
    if (!p_) return;
    if constexpr (requires { System::deallocate_pinned(p_); }) {
      if (pinned_) {
        System::deallocate_pinned(p_);
        return;
      }
    }
    host_pages::deallocate(p_, bytes_, io_alignment);
  }
  float* floats() const { return static_cast<float*>(p_); }
  void* data() const { return p_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  bool pinned_ = false;
  accounted held_;
};

}  // namespace zero::offload

namespace zero {

// A host_block of any system, type-erased: host memory holding a copy of an engine's state (an
// asynchronous checkpoint's snapshot, engine::snapshot_memory). Owns it; frees it when destroyed.
class snapshot_block {
 public:
  snapshot_block() = default;
  // `engine`: the lifetime token of the engine whose accounting counts it (none: not counted).
  template <class System>
  explicit snapshot_block(offload::host_block<System>&& b, std::weak_ptr<const void> engine = {})
      : data_(b.data()),
        bytes_(b.bytes()),
        owner_(std::make_shared<offload::host_block<System>>(std::move(b))),
        engine_(std::move(engine)) {}
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // Whether it was taken from this engine's lifetime token, which is still alive.
  template <class T>
  bool belongs_to(const std::shared_ptr<T>& engine) const {
    return engine && !engine_.owner_before(engine) && !engine.owner_before(engine_);
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::shared_ptr<void> owner_;
  std::weak_ptr<const void> engine_;
};

}  // namespace zero
