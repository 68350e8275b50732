// An engine's tensor-parallel group: which elements are pieces of split tensors, and the exchanges that make the norm,
// the skip and the checks whole-mesh decisions.
#pragma once

// An engine built over comm::mesh runs ZeRO over its data-parallel group; the ranks of its
// tensor-parallel group hold other pieces of the same model. What depends on the whole model is
// decided from small tables that every rank of the mesh sees whole, so every rank decides the same:
//   - the gradient norm: each data-parallel group sums the squares of the pieces of split tensors and,
//     apart, of the replicated tensors; the tensor-parallel group all-gathers both sums, and the norm
//     is the split sums added in tensor-parallel rank order, plus the replicated sum once (tp rank
//     0's). Every group's replicated sum must be the same bits: replicated tensors receive the same
//     gradient on every tensor-parallel rank (the user's to ensure: in the Megatron layout a replicated
//     tensor's inputs are the same on every rank of the group); where they differ, every rank throws.
//   - the skip: a non-finite value anywhere in the mesh makes the norm non-finite on every rank.
//   - the optimizer: each group's fingerprint verdict and hash ride on the same all-gather.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "zero/comm/call_label.hpp"
#include "zero/concepts/gradient_reducer.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/error.hpp"

namespace zero::tensor_parallel_detail {

// Calls f(part, split) for each tensor's share of the unit-local range r, in declaration order: part
// is unit-local, split says whether the tensor is cut across the tensor-parallel group.
template <class F>
void for_each_tensor_part(const unit_spec& us, const unit_layout& ul, range r, F&& f) {
  for (std::size_t t = 0; t < us.tensors.size(); ++t) {
    const range part = intersect(ul.tensors[t], r);
    if (!part.empty()) f(part, us.tensors[t].tp.split());
  }
}

// Every rank's n values of `backend` (ranks in its rank order) through the system's memory, taken from
// the system directly, outside memory(): a few words per step or per check.
template <class Sys, bool HostMemory, class Backend, class T>
std::vector<T> all_gather_words(Sys& sys, Backend& backend, const T* mine, std::size_t n, const char* phase) {
  const auto ranks = static_cast<std::size_t>(backend.size()), me = static_cast<std::size_t>(backend.rank());
  std::vector<T> all(n * ranks);
  const std::size_t bytes = all.size() * sizeof(T);
  if constexpr (HostMemory) {
    std::copy(mine, mine + n, all.begin() + static_cast<std::ptrdiff_t>(me * n));
    const comm::scoped_label<std::remove_cvref_t<decltype(backend.inner())>> l(backend.inner(), phase);
    backend.all_gather(all.data() + me * n, all.data(), n);
    return all;
  } else {
    struct system_free {
      std::size_t bytes;
      void operator()(T* p) const { Sys::deallocate(p, bytes); }
    };
    const std::unique_ptr<T, system_free> wire(static_cast<T*>(Sys::allocate(bytes)), system_free{bytes});
    sys.copy_from_host(wire.get() + me * n, mine, n * sizeof(T));
    {
      const comm::scoped_label<std::remove_cvref_t<decltype(backend.inner())>> l(backend.inner(), phase);
      backend.all_gather(wire.get() + me * n, wire.get(), n);
    }
    sys.copy_to_host(all.data(), wire.get(), bytes);
    return all;
  }
}

// A raw backend seen through the counted link's interface (inner()), for the checks of the whole
// mesh that run on the world's backend itself, outside comm().
template <class Comm>
struct raw {
  Comm& c;
  int size() const { return c.size(); }
  int rank() const { return c.rank(); }
  Comm& inner() const { return c; }
  template <class T>
  void all_gather(const T* in, T* out, std::size_t n) const {
    c.all_gather(in, out, n);
  }
};

template <class Ctx, class T>
std::vector<T> over_group(Ctx& c, const T* mine, std::size_t n, const char* phase) {
  return all_gather_words<typename Ctx::system, Ctx::host_memory>(c.sys, *c.tp, mine, n, phase);
}
template <class Ctx, class T>
std::vector<T> over_world(Ctx& c, const T* mine, std::size_t n, const char* phase) {
  raw<typename Ctx::comm_backend> w{*c.world};
  return all_gather_words<typename Ctx::system, Ctx::host_memory>(c.sys, w, mine, n, phase);
}

[[noreturn]] inline void replicated_gradients_differ(int rank, int tp_rank, double first, int other_tp, double other) {
  fail(error_kind::invalid_argument, "rank ", rank, " (tensor-parallel rank ", tp_rank,
       "): step(): the gradients of the replicated tensors differ across the tensor-parallel group (sum of squares ",
       first, " on tensor-parallel rank 0, ", other, " on tensor-parallel rank ", other_tp,
       "): a tensor declared tp_replicated must receive the same gradient on every rank of the group (sum partial "
       "gradients over the group before reduce(), or declare the tensor tp_split); no rank applied this step's "
       "update");
}

// What each data-parallel group's reducer found: the sums of squares of the split tensors' pieces
// and of the replicated tensors (over the whole data-parallel group), and whether its ranks'
// optimizers agreed.
struct norm_parts {
  double split = 0.0;
  double replicated = 0.0;
  bool agree = true;
};

// The mesh's norm from every tensor-parallel rank's parts (see the top of this file). Every rank of
// the mesh sees the same table: all return the same result or all throw.
template <class Ctx>
norm_result combine_norm(Ctx& c, norm_parts mine, std::uint64_t optimizer_hash) {
  constexpr std::size_t W = 5;
  const double words[W] = {mine.split, mine.replicated, mine.agree ? 1.0 : 0.0,
                           static_cast<double>(optimizer_hash >> 32),
                           static_cast<double>(optimizer_hash & 0xffffffffu)};
  const std::vector<double> all = over_group(c, words, W, "grad norm");
  const std::size_t T = static_cast<std::size_t>(c.tp_size);
  for (std::size_t t = 0; t < T; ++t)
    if (all[t * W + 2] != 1.0 || all[t * W + 3] != all[3] || all[t * W + 4] != all[4]) return {0.0, false};
  double total = 0.0;
  for (std::size_t t = 0; t < T; ++t) total += all[t * W];
  total += all[1];
  for (std::size_t t = 1; t < T; ++t)  // a non-finite value on any rank is the mesh's
    if (!std::isfinite(all[t * W + 1])) total += all[t * W + 1];
  if (std::isfinite(total))
    for (std::size_t t = 1; t < T; ++t)
      if (std::bit_cast<std::uint64_t>(all[t * W + 1]) != std::bit_cast<std::uint64_t>(all[1]))
        replicated_gradients_differ(c.rank, c.tp_rank, all[1], static_cast<int>(t), all[t * W + 1]);
  return {total, true};
}

// The whole model from every tensor-parallel rank's pieces (`all`: rank t's unpadded pieces, in the
// order of `pieces`, at t x pieces.numel()): each split tensor put together along its dimension, each
// replicated tensor from tp rank 0.
inline std::vector<float> whole_model(const model_spec& pieces, const std::vector<float>& all, int parts) {
  const std::size_t n = pieces.numel(), T = static_cast<std::size_t>(parts);
  std::vector<float> out;
  out.reserve(n * T);
  std::size_t at = 0;  // of the tensor in each rank's pieces
  for (const unit_spec& us : pieces.units())
    for (const tensor_spec& ts : us.tensors) {
      if (ts.tp_parts == 1) {
        out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(at),
                   all.begin() + static_cast<std::ptrdiff_t>(at + ts.numel));
      } else {
        const piece_runs r = runs_of(ts);
        const std::size_t base = out.size();
        out.resize(base + ts.numel * T);
        for (std::size_t t = 0; t < T; ++t)
          for (std::size_t o = 0; o < r.outer; ++o)
            std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(t * n + at + o * r.block), r.block,
                        out.begin() + static_cast<std::ptrdiff_t>(base + o * r.stride + t * r.block));
      }
      at += ts.numel;
    }
  return out;
}

}  // namespace zero::tensor_parallel_detail
