// Reduction operators of the collectives, as in NCCL (ncclSum, ncclMax).
#pragma once

namespace zero {

enum class reduce_op { sum, max };

inline const char* to_string(reduce_op op) { return op == reduce_op::sum ? "sum" : "max"; }

}  // namespace zero
