// The settings every rank of an engine must share (engine_options, the optimizer's hyper-parameters) as named words,
// a fingerprint of them that a sum all-reduce can check exactly, and the message naming what differs on which ranks.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/hash.hpp"
#include "zero/core/hyper_parameter.hpp"
#include "zero/core/value_checks.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/error.hpp"

namespace zero::detail {

// Settings as 64-bit words, one per field, in a fixed order (the same on every rank of one engine
// type): a float's or double's bits, an integer's value. Equal words, equal behaviour.
class settings {
 public:
  enum class kind : std::uint8_t { real32, real64, integer, boolean };

  void add(std::string_view name, float v) { push(name, kind::real32, std::bit_cast<std::uint32_t>(v)); }
  void add(std::string_view name, double v) { push(name, kind::real64, std::bit_cast<std::uint64_t>(v)); }
  void add(std::string_view name, bool v) { push(name, kind::boolean, v ? 1 : 0); }
  template <std::integral T>  // bool takes the overload above
  void add(std::string_view name, T v) {
    push(name, kind::integer, static_cast<std::uint64_t>(v));
  }

  void append(const settings& o) {
    names_.insert(names_.end(), o.names_.begin(), o.names_.end());
    kinds_.insert(kinds_.end(), o.kinds_.begin(), o.kinds_.end());
    words_.insert(words_.end(), o.words_.begin(), o.words_.end());
  }

  const std::vector<std::uint64_t>& words() const { return words_; }
  std::size_t size() const { return words_.size(); }
  std::string_view name(std::size_t i) const { return names_[i]; }
  // A word of field i as the value it encodes ("0.5", "4", "true").
  std::string text(std::size_t i, std::uint64_t w) const {
    switch (kinds_[i]) {
      case kind::real32:
        return show(std::bit_cast<float>(static_cast<std::uint32_t>(w)));
      case kind::real64:
        return concat(std::bit_cast<double>(w));
      case kind::boolean:
        return w ? "true" : "false";
      case kind::integer:
        break;
    }
    return concat(static_cast<std::int64_t>(w));
  }

 private:
  void push(std::string_view name, kind k, std::uint64_t w) {
    names_.emplace_back(name);
    kinds_.push_back(k);
    words_.push_back(w);
  }
  std::vector<std::string> names_;
  std::vector<kind> kinds_;
  std::vector<std::uint64_t> words_;
};

// Every engine_options field that changes what a rank computes or which collectives it makes. Not
// offload.directory (a path, which may differ from node to node) nor offload.direct_io (how a rank's
// own file is read).
inline settings options_settings(const engine_options& o) {
  settings s;
  s.add("engine_options::clip_norm", o.clip_norm);
  s.add("engine_options::compute_grad_norm", o.compute_grad_norm);
  s.add("engine_options::micro_batches", o.micro_batches);
  s.add("engine_options::accumulate", static_cast<int>(o.accumulate));
  s.add("engine_options::fp32_grad_accumulation", o.fp32_grad_accumulation);
  s.add("engine_options::loss_scale.dynamic", o.loss_scale.dynamic);
  s.add("engine_options::loss_scale.initial", o.loss_scale.initial);
  s.add("engine_options::loss_scale.growth_interval", o.loss_scale.growth_interval);
  s.add("engine_options::loss_scale.hysteresis", o.loss_scale.hysteresis);
  s.add("engine_options::loss_scale.min_scale", o.loss_scale.min_scale);
  s.add("engine_options::loss_scale.max_scale", o.loss_scale.max_scale);
  s.add("engine_options::init_chunk_elements", o.init_chunk_elements);
  s.add("engine_options::memory_limit_bytes", o.memory_limit_bytes);
  s.add("engine_options::verify_init", o.verify_init);
  s.add("engine_options::overlap", o.overlap);
  s.add("engine_options::prefetch_units", o.prefetch_units);
  s.add("engine_options::max_live_parameters", o.max_live_parameters);
  s.add("engine_options::reduces_in_flight", o.reduces_in_flight);
  s.add("engine_options::reduce_bucket_elements", o.reduce_bucket_elements);
  s.add("engine_options::gather_bucket_elements", o.gather_bucket_elements);
  s.add("engine_options::persist_below_elements", o.persist_below_elements);
  s.add("engine_options::offload.tier", static_cast<int>(o.offload.tier));
  s.add("engine_options::offload.slice_elements", o.offload.slice_elements);
  s.add("engine_options::zeropp.qwz", o.zeropp.qwz);
  s.add("engine_options::zeropp.weights.bits", o.zeropp.weights.bits);
  s.add("engine_options::zeropp.weights.block", o.zeropp.weights.block);
  s.add("engine_options::zeropp.qgz", o.zeropp.qgz);
  s.add("engine_options::zeropp.gradients.bits", o.zeropp.gradients.bits);
  s.add("engine_options::zeropp.gradients.block", o.zeropp.gradients.block);
  s.add("engine_options::zeropp.qgz_error_feedback", o.zeropp.qgz_error_feedback);
  s.add("engine_options::zeropp.hpz", o.zeropp.hpz);
  s.add("engine_options::zeropp.node_size", o.zeropp.node_size);
  s.add("engine_options::reproducible", o.reproducible);
  s.add("engine_options::shard_group_size", o.shard_group_size);
  s.add("engine_options::param_groups (how many)", o.param_groups.size());
  s.add("engine_options::param_groups (their names and values, hashed)", param_groups_hash(o.param_groups));
  return s;
}

// Every hyper-parameter of the optimizer (Opt::hyper_parameters()), as "optim::adamw::lr".
template <Optimizer Opt>
settings optimizer_settings(const Opt& opt) {
  settings s;
  for_each_hyper_parameter(Opt::hyper_parameters(),
                           [&](const auto& h) { s.add(concat("optim::", Opt::name, "::", h.name), opt.*(h.member)); });
  return s;
}

// The optimizer's fingerprint as the step's sum all-reduce carries it: the 64-bit hash of its words in
// four 16-bit chunks c, each sent as c and c^2 (fingerprint_words doubles). Sums of at most 2^21 ranks'
// chunks and squares are exact in double, and a rank's own chunks match the sums (S1 = N c and
// S2 = N c^2) only if every rank sent the same c: then the sum of (c_r - c)^2 = S2 - 2 c S1 + N c^2 is
// 0. So every rank reaches the same verdict from the same sums: all agree, or all see a difference.
inline constexpr std::size_t fingerprint_words = 8;
inline constexpr int max_fingerprint_ranks = 1 << 21;

inline std::uint64_t hash_of(const settings& s) { return fnv1a64(s.words().data(), s.size() * sizeof(std::uint64_t)); }
inline void fingerprint_terms(std::uint64_t h, double* out) {
  for (int k = 0; k < 4; ++k) {
    const double c = static_cast<double>((h >> (16 * k)) & 0xffffu);
    out[k] = c;
    out[4 + k] = c * c;
  }
}
// Whether the summed terms over `ranks` ranks are `mine` on every rank (see fingerprint_terms).
inline bool fingerprints_agree(const double* mine, const double* sums, int ranks) {
  for (std::size_t k = 0; k < fingerprint_words; ++k)
    if (sums[k] != static_cast<double>(ranks) * mine[k]) return false;
  return true;
}

// From every rank's words (rank r's at table[r * n]): "" where they all agree, else a message naming
// each field that differs, its value on rank 0 and the ranks (and values) that differ from it.
inline std::string disagreement(const settings& mine, const std::vector<std::uint64_t>& table, int ranks) {
  const std::size_t n = mine.size();
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    std::string others;
    for (int r = 1; r < ranks; ++r) {
      const std::uint64_t w = table[static_cast<std::size_t>(r) * n + i];
      if (w != table[i]) others += concat(others.empty() ? "" : ", ", mine.text(i, w), " on rank ", r);
    }
    if (!others.empty())
      out += concat(out.empty() ? "" : "; ", mine.name(i), " is ", mine.text(i, table[i]), " on rank 0 but ", others);
  }
  return out;
}

}  // namespace zero::detail
