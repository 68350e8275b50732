// loss_scaler: the dynamic loss scale of fp16 training, identical on every rank because every rank sees the same overflow flag.
#pragma once

#include <cstdint>
#include <string_view>

#include "zero/core/value_checks.hpp"
#include "zero/error.hpp"

namespace zero {

struct loss_scale_options {
  bool dynamic = true;                 // false: the scale stays at `initial` (a static scale)
  float initial = 65536.0f;            // 2^16
  std::uint64_t growth_interval = 1000;  // clean steps after which the scale doubles
  int hysteresis = 2;                  // overflows tolerated before the scale is halved
  float min_scale = 1.0f;
  float max_scale = 16777216.0f;       // 2^24
};

// Throws zero::error (invalid_argument) naming the field and its range. The scales are powers of two
// so that halving and doubling are exact and the engine's one division by N x scale is exact too.
inline void validate(const loss_scale_options& o) {
  constexpr std::string_view owner = "loss_scale_options";
  detail::require_power_of_two(owner, "initial", o.initial);
  detail::require_power_of_two(owner, "min_scale", o.min_scale);
  detail::require_power_of_two(owner, "max_scale", o.max_scale);
  ZERO_CHECK(o.min_scale <= o.initial && o.initial <= o.max_scale, invalid_argument,
             "loss_scale_options: need min_scale <= initial <= max_scale, got min_scale ", detail::show(o.min_scale),
             ", initial ", detail::show(o.initial), ", max_scale ", detail::show(o.max_scale));
  ZERO_CHECK(o.hysteresis >= 1, invalid_argument, "loss_scale_options: hysteresis must be >= 1, got ", o.hysteresis);
  ZERO_CHECK(o.growth_interval >= 1, invalid_argument, "loss_scale_options: growth_interval must be >= 1, got ",
             o.growth_interval);
}

// The rules, applied once per step after the (global) overflow check:
//   overflow:  the step is skipped; clean_steps = 0; hysteresis_left -= 1, and when it reaches 0
//              the scale halves (not below min_scale) and hysteresis_left = hysteresis.
//   clean:     clean_steps += 1; after growth_interval clean steps the scale doubles (not above
//              max_scale), clean_steps = 0 and hysteresis_left = hysteresis.
// A static scaler keeps its scale; overflowing steps are still skipped.
class loss_scaler {
 public:
  loss_scaler() = default;
  explicit loss_scaler(const loss_scale_options& o) : o_(o), scale_(o.initial), hysteresis_left_(o.hysteresis) {
    validate(o);
  }

  float scale() const { return scale_; }
  std::uint64_t clean_steps() const { return clean_steps_; }
  int hysteresis_left() const { return hysteresis_left_; }
  const loss_scale_options& options() const { return o_; }

  void update(bool overflow) {
    if (!o_.dynamic) return;
    if (overflow) {
      clean_steps_ = 0;
      if (--hysteresis_left_ <= 0) {
        scale_ = scale_ / 2 < o_.min_scale ? o_.min_scale : scale_ / 2;
        hysteresis_left_ = o_.hysteresis;
      }
      return;
    }
    if (++clean_steps_ >= o_.growth_interval) {
      scale_ = scale_ * 2 > o_.max_scale ? o_.max_scale : scale_ * 2;
      clean_steps_ = 0;
      hysteresis_left_ = o_.hysteresis;
    }
  }

  // Restores a saved state (checkpoints).
  void restore(float scale, std::uint64_t clean_steps, int hysteresis_left) {
    ZERO_CHECK(scale > 0 && hysteresis_left >= 0, invalid_argument, "loss_scaler: invalid saved state (scale ",
               scale, ", hysteresis_left ", hysteresis_left, ")");
    scale_ = scale;
    clean_steps_ = clean_steps;
    hysteresis_left_ = hysteresis_left;
  }

 private:
  loss_scale_options o_{};
  float scale_ = 1.0f;
  std::uint64_t clean_steps_ = 0;
  int hysteresis_left_ = 2;
};

}  // namespace zero
