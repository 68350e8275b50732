// The ranks' agreement: their settings at construction, their optimizers at every step, their initial values.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/comm/call_label.hpp"
#include "zero/concepts/gradient_reducer.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/engine/agreement.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/tensor_parallel.hpp"
#include "zero/error.hpp"

namespace zero {

// What every rank must share, checked where it can first differ (agreement.hpp has the words and the
// fingerprint): the engine_options and optimizer hyper-parameters at construction (an all-gather of
// their words on the backend itself, outside comm() and memory()); the optimizer again at every step
// (its fingerprint, on the norm's all-reduce where the step makes one, else on an all-reduce of its
// own started at the step's first reduce); the values of an every_rank initialization (a hash per
// tensor). A disagreement throws invalid_argument on every rank, naming the fields, tensors and ranks.
template <class Ctx, class Opt>
class rank_agreement {
 public:
  using system = typename Ctx::system;
  using Comm = typename Ctx::comm_backend;

  explicit rank_agreement(Ctx& c) : ctx_(c) {}
  rank_agreement(const rank_agreement&) = delete;
  rank_agreement& operator=(const rank_agreement&) = delete;

  // At construction, before the model states are allocated: every rank's options and optimizer.
  void check_settings(const Opt& opt) {
    ZERO_CHECK(ctx_.dp_size() <= detail::max_fingerprint_ranks, invalid_argument, "rank ", ctx_.rank,
               ": engine: ", ctx_.dp_size(),
               " ranks, more than the 2^21 whose settings fingerprint the step checks exactly");
    fingerprint(opt);
    Comm& everyone = whole();
    if (everyone.size() == 1) return;
    detail::settings all = detail::options_settings(ctx_.options);
    all.add("model_spec's tensor groups (unit_builder::group, hashed)", tensor_groups_hash(ctx_.spec));
    all.append(detail::optimizer_settings(opt));
    const std::string d =
        detail::disagreement(all, gather_words(all.words(), "settings check", everyone), everyone.size());
    ZERO_CHECK(d.empty(), invalid_argument, "rank ", ctx_.rank, ": engine: the ranks' settings differ: ", d,
               " (every rank", ctx_.world ? " of the mesh (ranks counted in the world)" : "",
               " must build its engine with the same engine_options and optimizer hyper-parameters)");
  }
  // The optimizer's hash and fingerprint terms, after each change of its hyper-parameters.
  void fingerprint(const Opt& opt) {
    hash_ = detail::hash_of(detail::optimizer_settings(opt));
    detail::fingerprint_terms(hash_, fingerprint_.data());
  }
  // What a reducer's norm collective carries for the check.
  agreement_terms terms() const { return {fingerprint_.data(), hash_, agreed_}; }

  // The step's own all-reduce of the fingerprint (where the norm carries none: `separate`), started at
  // its first reduce (nonblocking where the backend overlaps) and completed by finish().
  void start(bool separate) {
    if (started_ || !separate) return;
    started_ = true;
    agreed_ = true;
    double* wire = host_.data();  // host memory, or a wire taken from the system once
    if constexpr (!Ctx::host_memory) {
      if (!wire_) wire_.reset(static_cast<double*>(system::allocate(sizeof fingerprint_)));
      wire = wire_.get();
    }
    ctx_.sys.copy_from_host(wire, fingerprint_.data(), sizeof fingerprint_);
    const comm::scoped_label<Comm> l(ctx_.protocol.inner(), "settings check");
    request_ = link().start_all_reduce(wire, wire, fingerprint_.size(), reduce_op::sum);
  }
  void finish(const Opt& opt) {
    if (!started_) return;
    started_ = false;
    link().wait(request_);
    std::array<double, detail::fingerprint_words> sums{};
    ctx_.sys.copy_to_host(sums.data(), Ctx::host_memory ? host_.data() : wire_.get(), sizeof sums);
    if (detail::fingerprints_agree(fingerprint_.data(), sums.data(), ctx_.dp_size())) return;
    // In a mesh the other data-parallel groups may agree: the verdict rides on the norm's exchange
    // (terms().agreed), and every rank of the mesh throws there together.
    if (ctx_.world) {
      agreed_ = false;
      return;
    }
    optimizers_disagree(opt);
  }
  // Reached by every rank of a step whose fingerprints differ (they all see the same sums): gathers
  // the hyper-parameters to name the fields and ranks, and throws before any rank updates.
  [[noreturn]] void optimizers_disagree(const Opt& opt) {
    const detail::settings s = detail::optimizer_settings(opt);
    Comm& everyone = whole();
    const std::string d = detail::disagreement(s, gather_words(s.words(), "settings check", everyone), everyone.size());
    fail(error_kind::invalid_argument, "rank ", ctx_.rank,
         ": step(): the ranks' optimizer hyper-parameters differ: ", d,
         "; set_optimizer() and set_learning_rate() must make the same change on every rank (no rank applied this "
         "step's update)");
  }

  // every_rank initialization: all-gathers every rank's per-tensor hashes (run_hash64 of the fp32
  // values it produced; two doubles of 32 bits each per hash, exact whatever its value) on the set-up
  // counter, comm().other. Every rank sees the same table and so decides the same: all return, or all
  // throw invalid_argument naming the first tensor, in declaration order, that some rank produced
  // differently from rank 0, and those ranks. The wire is taken from the system directly, outside
  // memory() (as a checkpoint's control collectives are): 16 bytes per tensor per rank, freed before
  // initialize() returns, so memory() and plan() keep describing the model states and the protocol.
  //
  // `period`: rank r's values must equal rank r % period's (1: rank 0's, where every rank produces the
  // same values; the shard group size where each group's ranks produce their slices, which the other
  // groups replicate). Over the whole data-parallel group (replicas included).
  void check_init(const std::vector<std::uint64_t>& hashes, int period = 1) {
    if (hashes.empty()) return;  // no tensors: the same on every rank
    const std::size_t n = 2 * hashes.size(), ranks = static_cast<std::size_t>(ctx_.dp_size());
    const std::size_t mine = n * static_cast<std::size_t>(ctx_.dp_rank()), bytes = n * ranks * sizeof(double);
    std::vector<double> table(n * ranks);
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      table[mine + 2 * i] = static_cast<double>(hashes[i] >> 32);
      table[mine + 2 * i + 1] = static_cast<double>(hashes[i] & 0xffffffffu);
    }
    const std::unique_ptr<double, system_free> wire(static_cast<double*>(system::allocate(bytes)), system_free{bytes});
    ctx_.sys.copy_from_host(wire.get() + mine, table.data() + mine, n * sizeof(double));
    {
      const comm::scoped_label<Comm> l(ctx_.protocol.inner(), "init check");
      ctx_.setup().all_gather(wire.get() + mine, wire.get(), n);
    }
    ctx_.sys.copy_to_host(table.data(), wire.get(), bytes);
    const auto hash_of = [&](std::size_t r, std::size_t i) {
      return (static_cast<std::uint64_t>(table[r * n + 2 * i]) << 32) |
             static_cast<std::uint64_t>(table[r * n + 2 * i + 1]);
    };
    std::size_t i = 0;
    for (const unit_spec& us : ctx_.spec.units()) {
      for (const tensor_spec& ts : us.tensors) {
        std::string differing;
        std::size_t first = 0;
        const auto p = static_cast<std::size_t>(period);
        for (std::size_t r = 1; r < ranks; ++r)
          if (hash_of(r, i) != hash_of(r % p, i)) {
            differing += detail::concat(differing.empty() ? "" : ", ", r);
            if (first == 0) first = r;
          }
        const std::size_t ref = first % p;
        ZERO_CHECK(differing.empty(), invalid_argument, "rank ", ctx_.dp_rank(),
                   ": initialize (init_source::every_rank): unit '", us.name, "', tensor '", ts.name, "': rank(s) ",
                   differing, " produced other values than rank ", ref,
                   p > 1 ? " (the same position in the first replica group)" : "",
                   " (hash of the values: ", hex(hash_of(ref, i)), " on rank ", ref, ", ", hex(hash_of(first, i)),
                   " on rank ", first,
                   "); every_rank needs an init function that gives every rank the same values (deterministic, not "
                   "seeded by rank), or use init_source::broadcast_from_rank0. The parameters now disagree across "
                   "ranks: initialize again or load a checkpoint before training");
        ++i;
      }
    }
  }

  // In a tensor-parallel mesh, after either form of initialize(): per tensor of spec (the pieces),
  // the hash of the values this rank stored and whether they were all the same value. One all-gather
  // over the whole mesh (on the world's backend, outside comm()), from which every rank reaches the
  // same verdict: all return, or all throw invalid_argument naming the first tensor, in declaration
  // order, where
  //   - a data-parallel rank produced other values than its group's rank 0 (`dp_check`: the every_rank
  //     forms where values are produced by several ranks, as check_init);
  //   - a replicated tensor differs across a tensor-parallel group;
  //   - the pieces of a split tensor are the same values, not all equal, on every rank of a group: an
  //     init function that gave every rank the same tensor instead of its piece (from_whole_tensors
  //     does the cutting).
  // The ranks of a tensor-parallel group hold the same element ranges (their layouts are equal), so
  // their hashes compare.
  // `period`: as check_init's (the shard group's size where replicated groups each produce their slices).
  void check_mesh_init(const std::vector<std::uint64_t>& hashes, const std::vector<bool>& constant, bool dp_check,
                       int period = 1) {
    const std::size_t m = hashes.size();
    std::vector<std::int64_t> mine(2 * m);
    for (std::size_t i = 0; i < m; ++i) {
      mine[2 * i] = static_cast<std::int64_t>(hashes[i]);
      mine[2 * i + 1] = constant[i] ? 1 : 0;
    }
    const std::vector<std::int64_t> table =
        tensor_parallel_detail::over_world(ctx_, mine.data(), mine.size(), "init check");
    const std::size_t T = static_cast<std::size_t>(ctx_.tp_size), D = table.size() / (2 * m * T);
    const auto hash = [&](std::size_t i, std::size_t t, std::size_t k) { return table[(i * T + t) * 2 * m + 2 * k]; };
    const auto flat = [&](std::size_t i, std::size_t t, std::size_t k) {
      return table[(i * T + t) * 2 * m + 2 * k + 1] != 0;
    };
    std::size_t k = 0;
    for (const unit_spec& us : ctx_.spec.units())
      for (const tensor_spec& ts : us.tensors) {
        const std::string where = detail::concat("rank ", ctx_.rank, " (tensor-parallel rank ", ctx_.tp_rank,
                                                 "): initialize: unit '", us.name, "', tensor '", ts.name, "': ");
        const auto p = static_cast<std::size_t>(period);
        for (std::size_t t = 0; t < T && dp_check; ++t)
          for (std::size_t i = 1; i < D; ++i)
            ZERO_CHECK(hash(i, t, k) == hash(i % p, t, k), invalid_argument, where, "data-parallel rank ", i,
                       " of tensor-parallel rank ", t, " produced other values than data-parallel rank ", i % p,
                       p > 1 ? " (the same position in the first replica group)" : "",
                       "; every_rank needs an init function that "
                       "gives every data-parallel rank the same values (deterministic, not seeded by rank). The "
                       "parameters now disagree across ranks: initialize again before training");
        for (std::size_t i = 0; i < D; ++i) {
          bool same = true;
          for (std::size_t t = 1; t < T; ++t) same = same && hash(i, t, k) == hash(i, 0, k);
          if (!ts.tp.split()) {
            std::size_t t = 1;
            while (t < T && hash(i, t, k) == hash(i, 0, k)) ++t;
            ZERO_CHECK(same, invalid_argument, where,
                       "a replicated tensor (tp_replicated) has other values on tensor-parallel rank ", t,
                       " than on tensor-parallel rank 0 (data-parallel rank ", i,
                       "): give every rank of the group the same values, or declare the tensor tp_split if each "
                       "rank holds a piece. The parameters now disagree across ranks: initialize again before "
                       "training");
          } else {
            ZERO_CHECK(!same || flat(i, 0, k), invalid_argument, where, "every tensor-parallel rank holds the same ",
                       "values for its piece of a split tensor (tp_split(", ts.tp.split_dim,
                       ")), not all equal: the init function filled each piece as if it were the whole tensor (wrap "
                       "a function of whole tensors in zero::from_whole_tensors), or the tensor is replicated and "
                       "should be declared tp_replicated. The parameters are not the model's: initialize again "
                       "before training");
          }
        }
        ++k;
      }
  }

 private:
  // Frees memory taken from the system directly (outside memory()); system::deallocate takes the size.
  struct system_free {
    std::size_t bytes = 0;
    void operator()(void* p) const { system::deallocate(p, bytes); }
  };

  // Every rank's words in rank order, all-gathered on the backend itself (through the system's memory
  // where it is not host memory), outside comm() and memory(): construction and failure paths only.
  std::vector<std::uint64_t> gather_words(const std::vector<std::uint64_t>& mine, const char* phase, Comm& backend) {
    const std::size_t n = mine.size(), me = static_cast<std::size_t>(backend.rank());
    std::vector<std::uint64_t> all(n * static_cast<std::size_t>(backend.size()));
    if constexpr (Ctx::host_memory) {
      std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(me * n));
      auto* words = reinterpret_cast<std::int64_t*>(all.data());  // the signed view of the same words
      const comm::scoped_label<Comm> l(backend, phase);
      backend.all_gather(words + me * n, words, n);
      return all;
    }
    const std::size_t bytes = all.size() * sizeof(std::int64_t);
    const std::unique_ptr<std::int64_t, system_free> wire(static_cast<std::int64_t*>(system::allocate(bytes)),
                                                          system_free{bytes});
    ctx_.sys.copy_from_host(wire.get() + me * n, mine.data(), n * sizeof(std::int64_t));
    {
      const comm::scoped_label<Comm> l(backend, phase);
      backend.all_gather(wire.get() + me * n, wire.get(), n);
    }
    ctx_.sys.copy_to_host(all.data(), wire.get(), bytes);
    return all;
  }
  // The ranks that must agree: the engine's, or in a tensor-parallel mesh the whole mesh's (the world),
  // or with replicated shard groups the whole data-parallel group.
  Comm& whole() const {
    if (ctx_.world) return *ctx_.world;
    return ctx_.everyone ? ctx_.everyone->inner() : ctx_.protocol.inner();
  }
  // Where the step's own fingerprint check runs: the engine's control counter, or every replica's.
  typename Ctx::link& link() const { return ctx_.everyone_control ? *ctx_.everyone_control : ctx_.control; }
  static std::string hex(std::uint64_t h) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int k = 15; k >= 0; --k, h >>= 4) s[static_cast<std::size_t>(k)] = digits[h & 0xf];
    return s;
  }

  Ctx& ctx_;
  // The optimizer's hash and fingerprint terms, and the separate check's wire and request (declared
  // after the wire: destroyed, and so waited for, first).
  std::uint64_t hash_ = 0;
  std::array<double, detail::fingerprint_words> fingerprint_{};
  std::array<double, detail::fingerprint_words> host_{};
  std::unique_ptr<double, system_free> wire_{nullptr, system_free{sizeof(fingerprint_)}};
  typename Ctx::request request_{};
  bool started_ = false;
  bool agreed_ = true;  // the separate check's verdict, in a mesh (finish())
};

}  // namespace zero
