// The host's element-wise loops (sys::host::for_each), quantizer and reproducible-mode passes against memcpy and the
// optimizer update in the same run, one thread (and the AdamW update over a pool of 1 and 2 threads), one JSON line
// per case.
//
// Usage: bench_host_loops [--mib M] [--reps R] [--levels] [--small-pages] [--adamw-only] [--products-only]
//   M: MiB of the largest array (default 256: far beyond the last-level cache); R: repetitions
//   (default 7; the median is reported with min and max). --levels also runs every ISA level the CPU
//   has (host_loop::set_cap), besides the default (best) one and the old scalar loop. --small-pages
//   allocates the arrays at cache-line alignment on 4 KiB pages instead of the engine's allocation; --adamw-only
//   runs memcpy, the fp32 AdamW update and the engine's step only; --products-only the matrix products only.
// Bytes moved per element count each array read once and each array written once (an operand that
// is read and written counts twice), as memcpy's read + write does. The quantizer (int8 and int4,
// blocks of 256) is reported as a fraction of memcpy's bytes/s; the reproducible mode's passes (cut
// into words, merge, rounding, summary; on an eighth of the elements, their int64 planes being 24
// bytes each) as their time per element over the fp32 AdamW update's at the same size ("of_update"). Last, a
// 1-rank engine's reduce() + step() over the same update's loop ("of_loop"), Muon's orthogonalization with the
// host's products against the same order one element at a time ("over_ordered"), and the host's products on
// the orthogonalization's shapes against OpenBLAS's sgemm at 1 and 2 threads ("of_sgemm"; where the bench was
// built with OpenBLAS).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zero/core/thread_pool.hpp"
#include "zero/zero.hpp"

#if defined(ZERO_BENCH_WITH_OPENBLAS)
#include <cblas.h>
// OpenBLAS's own (not in every cblas.h): the threads of its next calls.
extern "C" void openblas_set_num_threads(int);
#endif

namespace {

using namespace zero;
namespace hl = zero::sys::host_loop;
using clock_type = std::chrono::steady_clock;

struct stats {
  double median, min, max;
};

template <class F>
stats time_reps(int reps, F&& f) {
  f();  // warm: pages touched, caches and the branch predictor in their steady state
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double>(clock_type::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

// The pre-SIMD host loop, kept here for comparison: rule(j, ...) one element at a time.
template <class Rule, class... Ts>
void scalar_loop(std::size_t n, const Rule& rule, Ts*... p) {
  for (std::size_t j = 0; j < n; ++j) rule(j, p...);
}

// --small-pages: the arrays at cache-line alignment on 4 KiB pages, as a general-purpose allocator
// gives them (glibc's, torch's); by default the engine's own allocation (sys::host::allocate: huge
// pages for large arrays), so that the loops run on the memory an engine's shards get.
bool small_pages = false;
// --adamw-only: memcpy, the fp32 AdamW update and the engine's step (bench/peer_cpu_adam.sh's cases).
bool adamw_only = false;

// n elements of T from the allocation the run measures.
template <class T>
class host_array {
 public:
  host_array() = default;
  explicit host_array(std::size_t n) : n_(n) {
    data_ = static_cast<T*>(small_pages ? ::operator new(bytes(), std::align_val_t{64}) : sys::host::allocate(bytes()));
  }
  host_array(host_array&& o) noexcept : data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  host_array& operator=(host_array&& o) noexcept {
    host_array t(std::move(o));
    std::swap(data_, t.data_);
    std::swap(n_, t.n_);
    return *this;
  }
  ~host_array() {
    if (!data_) return;
    if (small_pages) ::operator delete(data_, std::align_val_t{64});
    else sys::host::deallocate(data_, bytes());
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return data_[i]; }

 private:
  std::size_t bytes() const { return n_ * sizeof(T); }
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

template <class T>
host_array<T> filled(std::size_t n, float x) {
  host_array<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(x * (1.0f + 1e-3f * static_cast<float>(i % 1000)));
  return v;
}

double memcpy_gbs = 0;  // read + write, measured first
double update_ns = 0;   // ns per element of the fp32 AdamW update (best level) at the binned passes' size

void report(const std::string& what, const std::string& type, const std::string& loop, std::size_t n,
            double bytes_per_element, const stats& s) {
  const double gelem = static_cast<double>(n) / s.median / 1e9;
  const double gbs = gelem * bytes_per_element;
  std::printf(
      "{\"case\": \"%s\", \"type\": \"%s\", \"loop\": \"%s\", \"n\": %zu, \"bytes_per_element\": %.0f, "
      "\"gelem_per_s\": %.4f, \"gbytes_per_s\": %.3f, \"of_memcpy\": %.3f, \"time_s\": {\"median\": %.6f, \"min\": "
      "%.6f, "
      "\"max\": %.6f}, \"ns_per_element\": %.3f, \"of_update\": %.3f}\n",
      what.c_str(), type.c_str(), loop.c_str(), n, bytes_per_element, gelem, gbs, gbs / memcpy_gbs, s.median, s.min,
      s.max, 1.0 / gelem, update_ns > 0 ? 1.0 / gelem / update_ns : 0.0);
  std::fflush(stdout);
}

// The index loop the host ran the quantizer's rules with before its packed loops.
struct plain_index_system {
  template <class Rule>
  void for_each_index(std::size_t n, const Rule& rule) const {
    for (std::size_t j = 0; j < n; ++j) rule(j);
  }
  static void fill_zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
};

// `before` once, then `after` at the default level and (with --levels) each lower one, reported as
// `loop` and the level's name.
template <class Before, class After>
void run_levels(const std::string& what, const std::string& type, std::size_t n, double bpe, int reps, bool levels,
                Before&& before, After&& after, const char* loop = "packed ") {
  report(what, type, "scalar (before)", n, bpe, time_reps(reps, before));
  std::vector<hl::isa> caps{hl::active()};
  if (levels)
    for (hl::isa l : {hl::isa::avx2, hl::isa::sse2})
      if (l < hl::active()) caps.push_back(l);
  for (hl::isa l : caps) {
    const hl::isa previous = hl::set_cap(l);
    report(what, type, loop + std::string(hl::name(l)), n, bpe, time_reps(reps, after));
    hl::set_cap(previous);
  }
}

// One rule on the scalar loop (before), then sys::host::for_each at each level.
template <class Rule, class... Ts>
void run_case(const std::string& what, const std::string& type, std::size_t n, double bpe, int reps, bool levels,
              const Rule& rule, Ts*... p) {
  run_levels(
      what, type, n, bpe, reps, levels, [&] { scalar_loop(n, rule, p...); },
      [&] {
        sys::host::for_each(n, rule, elementwise::operand<Ts>{p, true, true}...);
      },
      "for_each ");
}

void quantizer_cases(std::size_t n, int reps, bool levels) {
  const auto x = filled<float>(n, 0.01f);
  for (int bits : {8, 4}) {
    const quant::format f{bits, 256};
    std::vector<std::uint8_t> wire(quant::wire_bytes(n, f));
    std::vector<float> y(n);
    const std::string name = bits == 8 ? "int8" : "int4";
    // Read the fp32 values, write the codes and scales; the dequantizer the other way.
    const double wire_bpe = static_cast<double>(wire.size()) / static_cast<double>(n);
    run_levels(
        "quantize", name, n, 4 + wire_bpe, reps, levels,
        [&] { quant::quantize(plain_index_system{}, x.data(), n, f, wire.data()); },
        [&] { quant::quantize(sys::host{}, x.data(), n, f, wire.data()); });
    run_levels(
        "dequantize", name, n, 4 + wire_bpe, reps, levels,
        [&] { quant::dequantize(plain_index_system{}, wire.data(), n, f, y.data()); },
        [&] { quant::dequantize(sys::host{}, wire.data(), n, f, y.data()); });
  }
}

void binned_cases(std::size_t n, int reps, bool levels) {
  auto g = filled<float>(n, 0.01f);
  {  // the reference: the default mode's update, fp32 AdamW at the best level
    auto w = filled<float>(n, 1.0f), m = filled<float>(n, 0.001f), v = filled<float>(n, 0.0001f);
    optim::adamw o;
    const auto c = o.constants(10);
    const stats s = time_reps(reps, [&] {
      sys::host::for_each(n, elementwise::update_in_place_rule<optim::adamw>{c, 2.0f, 1.0f},
                          elementwise::in(static_cast<const float*>(g.data())), elementwise::inout(w.data()),
                          elementwise::inout(m.data()), elementwise::inout(v.data()));
    });
    update_ns = s.median / static_cast<double>(n) * 1e9;
    report("adamw update (reference)", "fp32", std::string("for_each ") + hl::name(hl::active()), n, 4 + 8 + 16, s);
  }
  const int top = binned::summary_of(0.01f * 2.0f).bin;
  std::vector<std::int64_t> a(3 * n), b(3 * n);
  std::int64_t *a0 = a.data(), *a1 = a0 + n, *a2 = a1 + n, *b0 = b.data(), *b1 = b0 + n, *b2 = b1 + n;
  const elementwise::to_bins_rule cut{top};
  run_levels(
      "binned cut", "fp32", n, 4 + 24, reps, levels,
      [&] { scalar_loop(n, cut, static_cast<const float*>(g.data()), a0, a1, a2); },
      [&] {
        sys::host::for_each(n, cut, elementwise::in(static_cast<const float*>(g.data())), elementwise::out(a0),
                            elementwise::out(a1), elementwise::out(a2));
      });
  std::copy(a.begin(), a.end(), b.begin());
  const elementwise::merge_bins_rule merge{top, top, top};
  const std::int64_t *c0 = b0, *c1 = b1, *c2 = b2;
  run_levels(
      "binned merge", "int64", n, 72, reps, levels, [&] { scalar_loop(n, merge, a0, a1, a2, c0, c1, c2); },
      [&] {
        sys::host::for_each(n, merge, elementwise::inout(a0), elementwise::inout(a1), elementwise::inout(a2),
                            elementwise::in(c0), elementwise::in(c1), elementwise::in(c2));
      });
  std::vector<float> out(n);
  const elementwise::round_bins_rule round{top};
  run_levels(
      "binned round", "int64", n, 28, reps, levels, [&] { scalar_loop(n, round, out.data(), c0, c1, c2); },
      [&] {
        sys::host::for_each(n, round, elementwise::out(out.data()), elementwise::in(c0), elementwise::in(c1),
                            elementwise::in(c2));
      });
  {  // an owner's cut and sum of 4 ranks' slices (the reduce that exchanges values), rounded or stored
    std::vector<host_array<float>> ranks;
    std::vector<const float*> slices;
    for (int r = 0; r < 4; ++r) ranks.push_back(filled<float>(n, 0.01f * static_cast<float>(r + 1) / 4));
    for (const auto& r : ranks) slices.push_back(r.data());
    // With a store's words added (a later reduce of the step), and without (a unit's only reduce: its
    // rounded sum in doubles where exact, which these values' few binades allow).
    for (const auto& [rounded, store] : {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
      const elementwise::binned_cut_sum_rule<float> rule{
          slices.data(), 4, top, store ? top : -1, a0, a1, a2, rounded ? out.data() : nullptr};
      run_levels(
          !store    ? "binned cut sum of 4, rounded, no store"
          : rounded ? "binned cut sum of 4, rounded"
                    : "binned cut sum of 4, stored",
          "fp32", n, 16 + (rounded ? (store ? 24 : 0) + 4 : 48), reps, levels, [&] { scalar_loop(n, rule); },
          [&] { sys::host::for_each_index(n, rule); });
    }
  }
  std::int64_t sink = 0;
  run_levels(
      "binned summary", "fp32", n, 4, reps, levels,
      [&] {  // the loop before its packed form
        std::uint32_t largest = 0, flags = 0;
        for (std::size_t j = 0; j < n; ++j) {
          const std::uint32_t u = __builtin_bit_cast(std::uint32_t, g[j]) & 0x7fffffffu;
          flags |= u >= 0x7f800000u;
          const std::uint32_t finite = u < 0x7f800000u ? u : 0u;
          largest = finite > largest ? finite : largest;
        }
        sink += largest + flags;
      },
      [&] { sink += sys::host::binned_summary(static_cast<const float*>(g.data()), n); });
  if (sink == 42) std::printf("\n");  // keeps the summaries computed
}

template <class G>
void all_cases(std::size_t n, int reps, bool levels, const char* type) {
  const double gb = sizeof(G);
  auto g = filled<G>(n, 0.01f);
  auto w = filled<float>(n, 1.0f), m = filled<float>(n, 0.001f), v = filled<float>(n, 0.0001f);
  // Master weights without a separate parameter copy for fp32; with one (of G's type) otherwise,
  // as the engine runs them (precision::bf16 keeps fp32 master weights and bf16 parameters).
  auto p = filled<G>(n, 1.0f);
  const bool copy = !std::is_same_v<G, float>;
  const double pb = copy ? sizeof(G) : 0;
  {
    optim::adamw o;
    float* slots[2] = {m.data(), v.data()};
    const double bpe = gb + 8 + 16 + pb;  // g read; w read+write; m, v read+write; p written
    auto c = o.constants(10);
    if (copy)
      run_case("adamw", type, n, bpe, reps, levels, elementwise::update_rule<optim::adamw>{{c, 2.0f, 1.0f}},
               static_cast<const G*>(g.data()), w.data(), p.data(), slots[0], slots[1]);
    else
      run_case("adamw", type, n, bpe, reps, levels, elementwise::update_in_place_rule<optim::adamw>{c, 2.0f, 1.0f},
               static_cast<const G*>(g.data()), w.data(), slots[0], slots[1]);
    // engine_options::host_threads: the same update over a rank's pool of T threads, cut into
    // contiguous ranges as the engine's sweep cuts each segment.
    for (int t : {1, 2}) {
      thread_pool pool(t);
      report("adamw", type, "pool of " + std::to_string(t), n, bpe, time_reps(reps, [&] {
               pool.run(n, [&](std::size_t b, std::size_t e) {
                 float* s[2] = {m.data() + b, v.data() + b};
                 elementwise::update<optim::adamw>(sys::host{}, c, static_cast<const G*>(g.data()) + b, 2.0f, 1.0f,
                                                   w.data() + b, s, copy ? p.data() + b : static_cast<G*>(nullptr),
                                                   e - b);
               });
             }));
    }
  }
  if (adamw_only) return;
  {
    // AdamW with its moments as two bf16 in one slot: 8 bytes of slot traffic per element instead of 16,
    // and the stochastic rounding's hashing.
    optim::adamw_bf16 o;
    auto mv = filled<float>(n, 0.0f);
    float* slots[1] = {mv.data()};
    const double bpe = gb + 8 + 8 + pb;  // g read; w read+write; the slot read+write; p written
    auto c = o.constants(10);
    if (copy)
      run_case("adamw_bf16", type, n, bpe, reps, levels, elementwise::update_rule<optim::adamw_bf16>{{c, 2.0f, 1.0f}},
               static_cast<const G*>(g.data()), w.data(), p.data(), slots[0]);
    else
      run_case("adamw_bf16", type, n, bpe, reps, levels,
               elementwise::update_in_place_rule<optim::adamw_bf16>{c, 2.0f, 1.0f}, static_cast<const G*>(g.data()),
               w.data(), slots[0]);
  }
  {
    optim::sgd o;
    const double bpe = gb + 8 + 8 + pb;
    auto c = o.constants(10);
    if (copy)
      run_case("sgd", type, n, bpe, reps, levels, elementwise::update_rule<optim::sgd>{{c, 2.0f, 1.0f}},
               static_cast<const G*>(g.data()), w.data(), p.data(), m.data());
    else
      run_case("sgd", type, n, bpe, reps, levels, elementwise::update_in_place_rule<optim::sgd>{c, 2.0f, 1.0f},
               static_cast<const G*>(g.data()), w.data(), m.data());
  }
  {
    optim::lion o;
    const double bpe = gb + 8 + 8 + pb;
    auto c = o.constants(10);
    if (copy)
      run_case("lion", type, n, bpe, reps, levels, elementwise::update_rule<optim::lion>{{c, 2.0f, 1.0f}},
               static_cast<const G*>(g.data()), w.data(), p.data(), m.data());
    else
      run_case("lion", type, n, bpe, reps, levels, elementwise::update_in_place_rule<optim::lion>{c, 2.0f, 1.0f},
               static_cast<const G*>(g.data()), w.data(), m.data());
  }
  {
    // A later micro-batch: the store is read and written, the reduced gradient read.
    auto dst = filled<G>(n, 0.5f);
    run_case("accumulate", type, n, 3 * gb, reps, levels, elementwise::accumulate_rule{false}, dst.data(),
             static_cast<const G*>(g.data()));
  }
  {
    // fp32 master weights into G parameters.
    run_case("cast", type, n, 4 + gb, reps, levels, elementwise::cast_rule{}, p.data(),
             static_cast<const float*>(w.data()));
  }
}

// The step of a 1-rank engine (stage 1, fp32 AdamW, one unit of n elements, engine_options::host_threads =
// `threads`) next to the loop it runs over a pool of as many threads, in the same run: step() alone (the update, and
// the gradients left zero for the next step), and reduce() + step() (at one rank the reduce leaves the gradient where
// it is: a read of it). "of_loop": the engine's elements per second over the bare update's of the same size.
void engine_step_case(std::size_t n, int reps, int threads, offload_tier tier = offload_tier::none) {
  optim::adamw o;
  auto g = filled<float>(n, 0.01f), w = filled<float>(n, 1.0f), m = filled<float>(n, 0.001f),
       v = filled<float>(n, 0.0001f);
  const auto c = o.constants(10);
  thread_pool pool(threads);
  const stats loop = time_reps(reps, [&] {
    pool.run(n, [&](std::size_t b, std::size_t e) {
      float* slots[2] = {m.data() + b, v.data() + b};
      elementwise::update<optim::adamw>(sys::host{}, c, static_cast<const float*>(g.data()) + b, 1.0f, 1.0f,
                                        w.data() + b, slots, static_cast<float*>(nullptr), e - b);
    });
  });
  const std::string on = std::string(tier == offload_tier::host ? ", host offload" : "") +
                         (threads == 1 ? std::string() : ", " + std::to_string(threads) + " threads");
  report("adamw", "fp32", "update loop, for the engine" + on, n, 28, loop);
  g = {};
  w = {};
  m = {};
  v = {};
  model_spec spec;
  spec.unit("all").tensor("w", {n});
  std::vector<double> step_s, both_s;
  comm::threads::launch(1, [&](comm::threads& comm) {
    engine_options options;
    options.host_threads = threads;
    options.offload.tier = tier;
    engine<stage1, comm::threads, optim::adamw> e(comm, spec, optim::adamw{}, options);
    e.initialize([](const unit_spec&, const tensor_spec&, range r, std::span<float> x) {
      for (std::size_t j = 0; j < x.size(); ++j) x[j] = 1.0f + 1e-3f * static_cast<float>((r.begin + j) % 1000);
    });
    const unit_id u{0};
    for (int r = 0; r <= reps; ++r) {  // the first is the warm-up
      {
        auto gv = e.grads(u);  // the persistent gradient (stage 1): written by kernels, not timed
        (void)gv;
      }
      const auto a = clock_type::now();
      e.reduce(u);
      const auto b = clock_type::now();
      e.step();
      const auto end = clock_type::now();
      if (r == 0) continue;
      step_s.push_back(std::chrono::duration<double>(end - b).count());
      both_s.push_back(std::chrono::duration<double>(end - a).count());
    }
  });
  const auto summary = [](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return stats{t[t.size() / 2], t.front(), t.back()};
  };
  const stats step = summary(step_s), both = summary(both_s);
  report("adamw", "fp32", "engine step(), 1 rank" + on, n, 28, step);
  report("adamw", "fp32", "engine reduce() + step(), 1 rank" + on, n, 28, both);
  std::printf(
      "{\"case\": \"engine step over loop\", \"n\": %zu, \"threads\": %d, \"step_of_loop\": %.3f, "
      "\"reduce_and_step_of_loop\": %.3f, \"isa\": \"%s\"}\n",
      n, threads, loop.median / step.median, loop.median / both.median, hl::name(hl::active()));
  std::fflush(stdout);
}

// A matrix optimizer's orthogonalization (optim::muon's Newton-Schulz, five iterations) with the host's products
// (sys/host_products.hpp: blocked and packed, tiles of C in registers, on packs) against the same order one element
// at a time (newton_schulz::ordered_products) in the same run: the speed-up, the multiply-adds per second, and that the
// bits are the same. Shapes: train_gpt's default matrices (64 x 64, 256 x 64) and, with `large`, GPT-2 small's
// (768 x 768: seconds at one element at a time, left out of the smoke run).
void products_cases(int reps, bool levels, bool large) {
  struct shape {
    std::size_t rows, cols;
  };
  std::vector<hl::isa> isas{hl::active()};
  if (levels)
    for (int l = static_cast<int>(hl::isa::sse2); l < static_cast<int>(hl::active()); ++l)
      isas.push_back(static_cast<hl::isa>(l));
  for (const shape s : {shape{64, 64}, shape{256, 64}, shape{768, 768}}) {
    if (s.rows == 768 && !large) continue;
    std::vector<float> g(s.rows * s.cols), x, y;
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = 0.01f * static_cast<float>(static_cast<int>(i * 7919 % 201) - 100);
    optim::newton_schulz::workspace w;
    const int r = s.rows * s.cols > 100000 ? std::max(1, reps / 3) : reps;
    const stats ordered = time_reps(r, [&] {
      x = g;
      optim::newton_schulz::orthogonalize(x.data(), s.rows, s.cols, w);
    });
    for (const hl::isa level : isas) {
      const hl::isa before = hl::set_cap(level);
      const auto products = sys::host::products([](std::size_t n, auto&& f) { f(std::size_t{0}, n); });
      const stats fast = time_reps(r, [&] {
        y = g;
        optim::newton_schulz::orthogonalize(y.data(), s.rows, s.cols, w, products);
      });
      hl::set_cap(before);
      const double n = static_cast<double>(std::min(s.rows, s.cols)), m = static_cast<double>(std::max(s.rows, s.cols));
      const double madds = optim::newton_schulz::steps * (2.0 * n * n * m + n * n * n);
      std::printf(
          "{\"case\": \"newton_schulz\", \"rows\": %zu, \"cols\": %zu, \"time_s\": {\"median\": %.6f, \"min\": %.6f, "
          "\"max\": %.6f}, \"gmadds_per_s\": %.2f, \"over_ordered\": %.2f, \"same_bits\": %s, \"isa\": \"%s\"}\n",
          s.rows, s.cols, fast.median, fast.min, fast.max, madds / fast.median / 1e9, ordered.median / fast.median,
          std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0 ? "true" : "false", hl::name(level));
      std::fflush(stdout);
    }
  }
}

// The CPU's model name, family and model (/proc/cpuinfo: a virtual machine may name only the product line, "AMD
// EPYC"; family 25 model 17 is then Zen 4), for the records: figures from another machine are not comparable.
std::string cpu_model() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return "unknown";
  char line[512];
  std::string name = "unknown", family = "?", model = "?";
  const auto value = [](const std::string& l) {
    std::string v = l.substr(l.find(':') + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    return v;
  };
  while (std::fgets(line, sizeof line, f)) {
    const std::string l = line;
    if (l.find(':') == std::string::npos) break;  // the first processor's block ends with an empty line
    if (l.rfind("model name", 0) == 0) name = value(l);
    else if (l.rfind("cpu family", 0) == 0) family = value(l);
    else if (l.rfind("model\t", 0) == 0) model = value(l);
  }
  std::fclose(f);
  return name + " (family " + family + ", model " + model + ")";
}

// The host's products (sys/host_products.hpp) against OpenBLAS's cblas_sgemm on the same operands, on the three
// products of a Newton-Schulz iteration of an n x m matrix (n <= m): X X^T (n x m x n), A A (n x n x n) and B X
// (n x n x m), as n x k x m. For 1 and 2 threads (a thread_pool's run; openblas_set_num_threads), the two
// interleaved rep by rep, the best of the reps of each: G FLOP/s (2 n k m per product), ours over sgemm's
// ("of_sgemm"), and whether ours has the bits of newton_schulz::ordered_products (sgemm's sums are in another
// order: its bits are not compared). Shapes: 256 x 64 (train_gpt's), with `large` 768 x 768 and 1024 x 1024.
void gemm_cases(int reps, bool large) {
  struct shape {
    const char* product;
    std::size_t n, k, m;
  };
  std::vector<shape> shapes;
  for (const std::size_t d : {std::size_t{64}, std::size_t{768}, std::size_t{1024}}) {
    if (d > 64 && !large) continue;
    const std::size_t n = d, m = d == 64 ? 256 : d;
    shapes.push_back({"X X^T", n, m, n});
    shapes.push_back({"A A", n, n, n});
    shapes.push_back({"B X", n, n, m});
  }
  const std::string cpu = cpu_model();
#if !defined(ZERO_BENCH_WITH_OPENBLAS)
  std::printf(
      "{\"case\": \"products vs sgemm\", \"skipped\": \"built without OpenBLAS (bench/meson.build found none)\"}\n");
#endif
  for (const shape& s : shapes) {
    std::vector<float> a(s.n * s.k), b(s.k * s.m), c(s.n * s.m), want(s.n * s.m), blas(s.n * s.m);
    for (std::size_t i = 0; i < a.size(); ++i)
      a[i] = 0.01f * static_cast<float>(static_cast<int>(i * 7919 % 201) - 100);
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = 0.01f * static_cast<float>(static_cast<int>(i * 104729 % 199) - 99);
    optim::newton_schulz::ordered_products{}.multiply(a.data(), b.data(), want.data(), s.n, s.k, s.m);
    const double flop = 2.0 * static_cast<double>(s.n) * static_cast<double>(s.k) * static_cast<double>(s.m);
    // Enough reps that the best is the machine's, not a hiccup: more for the small shapes.
    const int r = flop > 1e9 ? reps : std::max(reps, static_cast<int>(2e9 / flop));
    for (const int threads : {1, 2}) {
      thread_pool pool(threads);
      const auto products = sys::host::products([&](std::size_t n, auto&& f) { pool.run(n, f); });
      double ours = 1e30;
      [[maybe_unused]] double theirs = 1e30;  // (sgemm's, where built with OpenBLAS)
#if defined(ZERO_BENCH_WITH_OPENBLAS)
      openblas_set_num_threads(threads);
#endif
      for (int rep = 0; rep <= r; ++rep) {  // rep 0 warms both (pages, caches, OpenBLAS's threads)
        auto t = clock_type::now();
        products.multiply(a.data(), b.data(), c.data(), s.n, s.k, s.m);
        const double mine = std::chrono::duration<double>(clock_type::now() - t).count();
        if (rep > 0) ours = std::min(ours, mine);
#if defined(ZERO_BENCH_WITH_OPENBLAS)
        t = clock_type::now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s.n), static_cast<int>(s.m),
                    static_cast<int>(s.k), 1.0f, a.data(), static_cast<int>(s.k), b.data(), static_cast<int>(s.m), 0.0f,
                    blas.data(), static_cast<int>(s.m));
        const double other = std::chrono::duration<double>(clock_type::now() - t).count();
        if (rep > 0) theirs = std::min(theirs, other);
#endif
      }
      const bool same = std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) == 0;
#if defined(ZERO_BENCH_WITH_OPENBLAS)
      std::printf(
          "{\"case\": \"products vs sgemm\", \"product\": \"%s\", \"n\": %zu, \"k\": %zu, \"m\": %zu, \"threads\": %d, "
          "\"ours_gflop_per_s\": %.1f, \"sgemm_gflop_per_s\": %.1f, \"of_sgemm\": %.3f, \"ours_s\": %.6f, "
          "\"sgemm_s\": %.6f, \"reps\": %d, \"same_bits\": %s, \"isa\": \"%s\", \"cpu\": \"%s\"}\n",
          s.product, s.n, s.k, s.m, threads, flop / ours / 1e9, flop / theirs / 1e9, theirs / ours, ours, theirs, r,
          same ? "true" : "false", hl::name(hl::active()), cpu.c_str());
#else
      std::printf(
          "{\"case\": \"products\", \"product\": \"%s\", \"n\": %zu, \"k\": %zu, \"m\": %zu, \"threads\": %d, "
          "\"ours_gflop_per_s\": %.1f, \"ours_s\": %.6f, \"reps\": %d, \"same_bits\": %s, \"isa\": \"%s\", "
          "\"cpu\": \"%s\"}\n",
          s.product, s.n, s.k, s.m, threads, flop / ours / 1e9, ours, r, same ? "true" : "false",
          hl::name(hl::active()), cpu.c_str());
#endif
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 256;
  int reps = 7;
  bool levels = false, products_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::stoul(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--levels") levels = true;
    else if (a == "--small-pages") small_pages = true;
    else if (a == "--adamw-only") adamw_only = true;
    else if (a == "--products-only") products_only = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--mib M] [--reps R] [--levels] [--small-pages] [--adamw-only] [--products-only]\n",
                   argv[0]);
      return 2;
    }
  }
  // Elements: the largest array (fp32) is `mib` MiB.
  const std::size_t n = mib * 1024 * 1024 / sizeof(float);
  if (products_only) {
    products_cases(reps, levels, mib >= 64);
    gemm_cases(reps, mib >= 64);
    return 0;
  }
  {
    auto a = filled<float>(n, 1.0f), b = filled<float>(n, 2.0f);
    const std::size_t bytes = n * sizeof(float);
    const stats s = time_reps(reps, [&] { std::memcpy(b.data(), a.data(), bytes); });
    memcpy_gbs = 2.0 * static_cast<double>(bytes) / s.median / 1e9;
    std::printf(
        "{\"case\": \"memcpy\", \"bytes\": %zu, \"gbytes_per_s\": %.3f, \"time_s\": {\"median\": %.6f, \"min\": %.6f, "
        "\"max\": %.6f}, \"isa\": \"%s\", \"pages\": \"%s\"}\n",
        bytes, memcpy_gbs, s.median, s.min, s.max, hl::name(hl::active()), small_pages ? "small" : "engine");
  }
  all_cases<float>(n, reps, levels, "fp32");
  if (adamw_only) {
    for (int threads : {1, 2}) engine_step_case(n, reps, threads);
    for (int threads : {1, 2}) engine_step_case(n, reps, threads, offload_tier::host);
    return 0;
  }
  all_cases<bf16>(n, reps, levels, "bf16");
  quantizer_cases(n, reps, levels);
  binned_cases(n / 8, reps, levels);
  for (int threads : {1, 2}) engine_step_case(n, reps, threads);
  engine_step_case(n, reps, 1, offload_tier::host);
  products_cases(reps, levels, mib >= 64);
  gemm_cases(reps, mib >= 64);
  if (levels && hl::detected() > hl::isa::avx2) {  // what a CPU without AVX-512 runs
    const hl::isa before = hl::set_cap(hl::isa::avx2);
    engine_step_case(n, reps, 1);
    hl::set_cap(before);
  }
  return 0;
}
