// Initial values: the init functions an engine takes (whole tensors, or element ranges) and where they run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <span>
#include <utility>
#include <vector>

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

// For an engine in a tensor-parallel mesh, whose init functions are asked for the pieces its ranks
// hold (tensor_spec::tp_parts and tp_index say which piece): adapts a function of the whole tensors,
// as declared in the model, so that each piece receives the whole tensor's values at its elements.
// The same function then gives the same model at every tensor-parallel size. The whole-tensor
// function sees the tensor's whole shape (and the unit as the engine holds it).
inline tensor_spec whole_tensor_of(const tensor_spec& piece) {
  tensor_spec w = piece;
  w.shape = whole_shape(piece);
  w.numel = piece.numel * static_cast<std::size_t>(piece.tp_parts);
  w.tp_parts = 1;
  w.tp_index = 0;
  return w;
}
inline init_range_fn from_whole_tensors(init_range_fn whole) {
  return [whole = std::move(whole)](const unit_spec& u, const tensor_spec& t, range r, std::span<float> v) {
    if (t.tp_parts == 1) return whole(u, t, r, v);
    const tensor_spec w = whole_tensor_of(t);
    const piece_runs runs = runs_of(t);
    for (std::size_t i = r.begin; i < r.end;) {  // one call per run of the piece inside r
      const std::size_t within = i % runs.block, n = std::min(runs.block - within, r.end - i);
      const std::size_t at = i / runs.block * runs.stride + runs.first + within;
      whole(u, w, range{at, at + n}, v.subspan(i - r.begin, n));
      i += n;
    }
  };
}
inline init_fn from_whole_tensors(init_fn whole) {
  return [whole = std::move(whole)](const unit_spec& u, const tensor_spec& t, std::span<float> v) {
    if (t.tp_parts == 1) return whole(u, t, v);
    const tensor_spec w = whole_tensor_of(t);
    std::vector<float> all(w.numel);
    whole(u, w, std::span<float>(all));
    for (std::size_t i = 0; i < t.numel; ++i) v[i] = all[whole_index(t, i)];
  };
}

// Calls f(piece) for consecutive pieces of r, each at most `chunk` elements (chunk > 0), in order.
template <class F>
void for_each_chunk(range r, std::size_t chunk, F&& f) {
  for (std::size_t at = r.begin; at < r.end; at += chunk) f(range{at, r.end - at < chunk ? r.end : at + chunk});
}

}  // namespace zero
