// The optimizer concepts: per-element state slots, hyper-parameters, and an element-wise update rule
// (OptimizerState), one that needs sums over whole tensors (TensorwiseOptimizer), or one that needs whole matrices
// (MatrixOptimizer).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zero/core/hyper_parameter.hpp"

namespace zero {

// Requirements:
//   O::slots                    constexpr int, 4-byte state values kept per parameter element: fp32, or
//                               bits the rule packs into a float itself (optim::adamw_bf16: two bf16),
//                               which the engine moves, saves and reshards bit for bit
//   O::name                     constexpr std::string_view, e.g. "adamw"
//   typename O::step_constants  what one step's update needs (learning rate, bias corrections...),
//                               computed once per step on the host and passed to every element
//   o.constants(t) -> step_constants, for the 1-based step number t
//   O::update(c, w, g, s)       ZERO_HD static: updates master weight w (float&) in place from the
//                               averaged gradient g (float) and the element's state s (float[slots])
//   O::slot_names               constexpr std::array<std::string_view, slots>: what a checkpoint calls
//                               each slot ("m", "v"), unique, none "master"
//   O::hyper_parameters()       static constexpr: a std::tuple of zero::field("lr", &O::lr), ... for
//                               every setting (core/hyper_parameter.hpp; float, double or bool), which
//                               a checkpoint saves and optimizer_from() reads back; std::tuple{} if none
// The metadata is required, not detected: an optimizer without it would train, then checkpoint its
// slots unnamed and its settings not at all.
// The rule is applied to the owned, unpadded elements only; it must use zero::fp operations so
// every backend performs the same floating-point operations.
//
// Optional:
//   o.validate()                checks the hyper-parameters and throws zero::error (invalid_argument)
//                               naming the field and its valid range. The engine calls it at
//                               construction and in set_optimizer(), where it exists (detected with
//                               `requires`, see validate_optimizer below), so an optimizer written
//                               without one still works; it is not part of the concept for that reason.
template <class O>
concept OptimizerState = requires(const O& o, std::uint64_t t, float& w, float g, float* s,
                                  const typename O::step_constants& c) {
  { O::slots } -> std::convertible_to<int>;
  { O::name } -> std::convertible_to<std::string_view>;
  { o.constants(t) } -> std::same_as<typename O::step_constants>;
  O::update(c, w, g, s);
  { O::slot_names } -> std::convertible_to<std::array<std::string_view, static_cast<std::size_t>(O::slots)>>;
  { O::hyper_parameters() } -> hyper_parameter_list<O>;
}
&&(O::slots >= 0);

// An optimizer whose step needs sums over each whole tensor (LAMB's trust ratio), which ZeRO cuts
// across ranks. The metadata of OptimizerState, and the update in three parts instead of one rule:
//   O::tensor_sums              constexpr int, 1..4: the sums of squares the step needs per tensor
//   O::advance(c, w, g, s)      ZERO_HD static: the slots s (float[slots]) from the averaged gradient g
//                               and the weight w, which it must not change (the first pass)
//   O::norm_terms(c, w, s, x)   ZERO_HD static: x[0..tensor_sums) from the weight and the advanced
//                               slots; the engine sums each one's squares over every tensor (exactly,
//                               so the sums do not depend on how the tensor is cut over ranks)
//   O::tensor_factor(c, sq)     static, host: one float per tensor from those sums (double[tensor_sums])
//   O::apply(c, f, w, s)        ZERO_HD static: the new weight from the tensor's factor f and the
//                               slots (the third pass, after every rank's sums are in)
// advance, norm_terms and apply must use zero::fp operations, as OptimizerState's update does; the
// engine runs them over a value type V (float, or a SIMD pack in the host loop) where they are templates.
// (Each concept is one requires-expression, so that a diagnostic lists every missing member at once.)
template <class O>
concept TensorwiseOptimizer = requires(const O& o, std::uint64_t t, float& w, float g, float* s, const float* cs,
                                       float* x, const double* sq, float f, const typename O::step_constants& c) {
  { O::slots } -> std::convertible_to<int>;
  { O::name } -> std::convertible_to<std::string_view>;
  { o.constants(t) } -> std::same_as<typename O::step_constants>;
  { O::slot_names } -> std::convertible_to<std::array<std::string_view, static_cast<std::size_t>(O::slots)>>;
  { O::hyper_parameters() } -> hyper_parameter_list<O>;
  { O::tensor_sums } -> std::convertible_to<int>;
  O::advance(c, static_cast<const float&>(w), g, s);
  O::norm_terms(c, static_cast<const float&>(w), cs, x);
  { O::tensor_factor(c, sq) } -> std::same_as<float>;
  O::apply(c, f, w, cs);
}
&&(O::slots >= 0) && (O::tensor_sums >= 1) && (O::tensor_sums <= 4);

// A tensor-wise optimizer whose last pass needs only the weight and one of its norm terms, the update's
// direction d (optional; optim::lamb): the engine keeps d from the first pass where the gradient store
// has room for it (fp32 elements, which that pass would only zero), and the last pass reads 8 bytes
// an element and recomputes nothing.
//   O::direction_term             constexpr int: the index of d among norm_terms' x
//   O::apply_direction(c, f, w, d)  ZERO_HD static: the new weight from the factor f and d, with the
//                                   bits O::apply gives from the slots
template <class O>
concept TensorwiseDirection = TensorwiseOptimizer<O> && requires(float& w, float f, const typename O::step_constants& c) {
  { O::direction_term } -> std::convertible_to<int>;
  O::apply_direction(c, f, w, static_cast<const float&>(w));
} && (O::direction_term >= 0) && (O::direction_term < O::tensor_sums);

// A tensor-wise optimizer one of whose norm terms is the weight itself (optional; optim::lamb's ||w||):
// the engine sums that term's squares from the weights, which the first pass leaves as they were,
// instead of storing a copy of each.
//   O::weight_term                constexpr int: the index among norm_terms' x of the term equal to w
template <class O>
concept TensorwiseWeightTerm = TensorwiseOptimizer<O> && requires {
  { O::weight_term } -> std::convertible_to<int>;
} && (O::weight_term >= 0) && (O::weight_term < O::tensor_sums);

namespace detail {
// What a matrix optimizer's orthogonalize is handed: the system's products (MatrixOptimizer below).
struct products_archetype {
  void multiply(const float*, const float*, float*, std::size_t, std::size_t, std::size_t) const {}
};
}  // namespace detail
// An optimizer whose step needs each weight matrix whole (Muon's orthogonalization), which ZeRO cuts
// across ranks. The metadata of OptimizerState and its element-wise rule, which the tensors that are
// not matrices take (1-D tensors, and those of a parameter group with param_group::element_wise), and
// for the matrices (every other tensor of 2 or more dimensions: shape (..., rows, cols), a stack of
// rows x cols matrices) the update in three parts:
//   O::matrix_slot              constexpr int, a slot that carries the matrix rule's input: `advance`
//                               writes it, `orthogonalize` rewrites it on the matrix whole, and
//                               `apply` reads that result in its place
//   typename O::workspace       what `orthogonalize` reuses from one matrix to the next
//   O::advance(c, w, g, s)      ZERO_HD static: the slots from the averaged gradient g (the first pass)
//   O::orthogonalize(x, rows, cols, ws, products)
//                               static, host: the rows x cols matrix x (row-major, the matrix slot's
//                               values of the whole matrix) rewritten in place, with the system's
//                               products: products.multiply(A, B, C, n, k, m) sets C (n x m) = A (n x k)
//                               B (k x m), row-major, each C(i, j) summed from +0 over k ascending,
//                               each operation rounded, every NaN canonical (sys/host_products.hpp)
//   O::matrix_factor(c, rows, cols) -> float, host: the matrix's step factor
//   O::apply(c, f, w, s)        ZERO_HD static: the new weight from the factor and the slots, the
//                               matrix slot holding the orthogonalized value (the last pass)
// The engine runs the orthogonalization of each matrix on one rank and hands the others their part
// (engine/matrix_owners.hpp), so it must be a fixed sequence of operations: the same bits wherever it
// runs.
template <class O>
concept MatrixOptimizer = OptimizerState<O> &&
    requires(const O& o, float& w, float g, float* s, const float* cs, float* x, float f, std::size_t n,
             typename O::workspace& ws, const typename O::step_constants& c) {
  { O::matrix_slot } -> std::convertible_to<int>;
  O::advance(c, static_cast<const float&>(w), g, s);
  O::orthogonalize(x, n, n, ws, detail::products_archetype{});
  { O::matrix_factor(c, n, n) } -> std::same_as<float>;
  O::apply(c, f, w, cs);
} &&(O::matrix_slot >= 0) && (O::matrix_slot < O::slots);

// An optimizer whose whole step is its element-wise rule: what a device system runs (the other kinds'
// passes are built for host systems only).
template <class O>
concept ElementwiseOptimizer = OptimizerState<O> && !MatrixOptimizer<O>;

// What an engine takes: any of the three kinds.
template <class O>
concept Optimizer = OptimizerState<O> || TensorwiseOptimizer<O>;  // MatrixOptimizer refines OptimizerState

// Calls o.validate() where the optimizer has one; nothing otherwise.
template <Optimizer O>
void validate_optimizer(const O& o) {
  if constexpr (requires { o.validate(); }) o.validate();
}

}  // namespace zero
