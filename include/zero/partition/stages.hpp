// The four ZeRO stages as Partitioner tag types: stage0 is plain data parallelism, stage3 shards everything.
#pragma once

#include "zero/concepts/partitioner.hpp"

namespace zero {

// Stage 0: everything replicated; gradients all-reduced. The baseline the other stages must match.
struct stage0 {
  static constexpr int stage = 0;
  static constexpr bool shards_optimizer_states = false;
  static constexpr bool shards_gradients = false;
  static constexpr bool shards_parameters = false;
};
static_assert(Partitioner<stage0>);

// Stage 1 (P_os): master weights and optimizer states sharded.
struct stage1 {
  static constexpr int stage = 1;
  static constexpr bool shards_optimizer_states = true;
  static constexpr bool shards_gradients = false;
  static constexpr bool shards_parameters = false;
};
static_assert(Partitioner<stage1>);

// Stage 2 (P_os+g): gradients sharded too; each unit's full gradient lives only until its reduce.
struct stage2 {
  static constexpr int stage = 2;
  static constexpr bool shards_optimizer_states = true;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = false;
};
static_assert(Partitioner<stage2>);

// Stage 3 (P_os+g+p): parameters sharded; a unit exists in full only between gather and release.
struct stage3 {
  static constexpr int stage = 3;
  static constexpr bool shards_optimizer_states = true;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = true;
};
static_assert(Partitioner<stage3>);

}  // namespace zero
