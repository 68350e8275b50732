// Initial values: the init functions an engine takes (whole tensors, or element ranges) and where they run.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"

namespace zero {

// Where initial values come from: every rank runs the init function (it must be deterministic),
// or rank 0 runs it and broadcasts.
enum class init_source { every_rank, broadcast_from_rank0 };

// The simple form: called once per tensor with the full tensor to fill, in declaration order. Every
// rank (or rank 0) produces every value and stages a whole tensor in host memory.
using init_fn = std::function<void(const unit_spec& unit, const tensor_spec& tensor, std::span<float> values)>;

// The form that scales with N: called with a tensor-local, row-major element range and a span of
// exactly elements.size() values, values[i] being element elements.begin + i of the tensor. The
// engine asks each rank only for the elements it keeps, in pieces of at most
// engine_options::init_chunk_elements, so host staging is bounded by the chunk and the work per rank
// falls with N. The values must depend on the element's index only, never on the range it arrives in
// (a counter-based generator, keyed by tensor and index, does this): then every N, stage and chunk
// size gives the same parameters. A function cannot write outside its range: it only gets the span.
using init_range_fn =
    std::function<void(const unit_spec& unit, const tensor_spec& tensor, range elements, std::span<float> values)>;

// Calls f(piece) for consecutive pieces of r, each at most `chunk` elements (chunk > 0), in order.
template <class F>
void for_each_chunk(range r, std::size_t chunk, F&& f) {
  for (std::size_t at = r.begin; at < r.end; at += chunk) f(range{at, r.end - at < chunk ? r.end : at + chunk});
}

}  // namespace zero
