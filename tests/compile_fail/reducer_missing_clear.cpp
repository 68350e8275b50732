// expect: GradientReducer
// expect: clear
#include "zero/zero.hpp"

// A gradient reducer without clear() (the store zeroed for the next step): refused by the concept,
// naming the member, rather than wherever the engine would call it.
struct context {};
struct no_clear {
  using context_type = context;
  using grad_type = float;
  static constexpr const char* name = "no_clear";
  static constexpr bool available = true;
  static bool chosen(const zero::engine_options&) { return true; }
  static void accept(const context&) {}
  static std::size_t grad_bytes(const zero::engine_options&) { return 4; }
  static std::uint64_t extra_state_bytes(const zero::engine_options&, std::uint64_t) { return 0; }
  explicit no_clear(context&) {}
  void open(zero::unit_id) {}
  float* unit_gradient(zero::unit_id) { return nullptr; }
  void reduce(zero::unit_id, bool) {}
  void flush() {}
  std::size_t in_flight() const { return 0; }
  std::size_t reserved_bytes() const { return 0; }
  void complete_oldest() {}
  void complete_all() {}
  zero::norm_result sum_of_squares(float, const zero::agreement_terms&) { return {}; }
  std::size_t averaging_count() const { return 1; }
  bool sharded() const { return false; }
  template <class F>
  void with_gradients(F&& f) const { f(static_cast<const float*>(nullptr)); }
};
static_assert(zero::GradientReducer<no_clear>);
