// zero::warmup_cosine: a learning-rate schedule (linear warm-up, then cosine decay) as a pure function of the step.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "zero/core/value_checks.hpp"
#include "zero/error.hpp"

namespace zero {

// The rate for the step that follows `done` completed steps (engine::steps()):
//   done <  warmup:         peak x (done + 1) / warmup         (the first step already moves)
//   warmup <= done < total: min + (peak - min) x (1 + cos(pi x (done - warmup) / (total - warmup))) / 2
//   done >= total:          min
// Computed in double and rounded to float once, from the step alone, so every rank, every stage and
// a run resumed from a checkpoint (whose steps() is restored) get the same bits. Typical use, before
// each step's first gather: e.set_learning_rate(schedule.at(e.steps())).
struct warmup_cosine {
  float peak = 1e-3f, min = 0.0f;
  std::uint64_t warmup = 0, total = 1;  // steps; warmup <= total

  // Throws invalid_argument naming the field: rates finite, 0 <= min <= peak, warmup <= total, total > 0.
  void validate() const {
    detail::require_non_negative("warmup_cosine", "peak", peak);
    detail::require_non_negative("warmup_cosine", "min", min);
    ZERO_CHECK(min <= peak, invalid_argument, "warmup_cosine: min must be <= peak, got min ", detail::show(min),
               " and peak ", detail::show(peak));
    ZERO_CHECK(total > 0, invalid_argument, "warmup_cosine: total must be > 0 steps");
    ZERO_CHECK(warmup <= total, invalid_argument, "warmup_cosine: warmup must be <= total, got warmup ", warmup,
               " and total ", total);
  }

  float at(std::uint64_t done) const {
    if (done < warmup) return static_cast<float>(static_cast<double>(peak) * static_cast<double>(done + 1) /
                                                 static_cast<double>(warmup));
    if (done >= total) return min;
    const double progress = static_cast<double>(done - warmup) / static_cast<double>(total - warmup);
    const double lo = min, hi = peak;
    return static_cast<float>(lo + (hi - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
  }
};

}  // namespace zero
