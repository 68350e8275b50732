// The host's element-wise loops (sys::host::for_each) against memcpy in the same run: G elem/s and the fraction of memcpy's bandwidth, one thread, one JSON line per case.
//
// Usage: bench_host_loops [--mib M] [--reps R] [--levels]
//   M: MiB of the largest array (default 256: far beyond the last-level cache); R: repetitions
//   (default 7; the median is reported with min and max). --levels also runs every ISA level the CPU
//   has (host_loop::set_cap), besides the default (best) one and the old scalar loop.
// Bytes moved per element count each array read once and each array written once (an operand that
// is read and written counts twice), as memcpy's read + write does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "zero/zero.hpp"

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

template <class T>
std::vector<T> filled(std::size_t n, float x) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(x * (1.0f + 1e-3f * static_cast<float>(i % 1000)));
  return v;
}

double memcpy_gbs = 0;  // read + write, measured first

void report(const std::string& what, const std::string& type, const std::string& loop, std::size_t n,
            double bytes_per_element, const stats& s) {
  const double gelem = static_cast<double>(n) / s.median / 1e9;
  const double gbs = gelem * bytes_per_element;
  std::printf(
      "{\"case\": \"%s\", \"type\": \"%s\", \"loop\": \"%s\", \"n\": %zu, \"bytes_per_element\": %.0f, "
      "\"gelem_per_s\": %.4f, \"gbytes_per_s\": %.3f, \"of_memcpy\": %.3f, \"time_s\": {\"median\": %.6f, \"min\": %.6f, "
      "\"max\": %.6f}}\n",
      what.c_str(), type.c_str(), loop.c_str(), n, bytes_per_element, gelem, gbs, gbs / memcpy_gbs, s.median, s.min,
      s.max);
  std::fflush(stdout);
}

// One case on the scalar loop, the default dispatch and (with --levels) each ISA level.
template <class Rule, class... Ts>
void run_case(const std::string& what, const std::string& type, std::size_t n, double bpe, int reps, bool levels,
              const Rule& rule, Ts*... p) {
  report(what, type, "scalar (before)", n, bpe, time_reps(reps, [&] { scalar_loop(n, rule, p...); }));
  std::vector<hl::isa> caps{hl::active()};
  if (levels)
    for (hl::isa l : {hl::isa::avx2, hl::isa::sse2})
      if (l < hl::active()) caps.push_back(l);
  for (hl::isa l : caps) {
    const hl::isa previous = hl::set_cap(l);
    report(what, type, std::string("for_each ") + hl::name(l), n, bpe,
           time_reps(reps, [&] { sys::host::for_each(n, rule, elementwise::operand<Ts>{p, true, true}...); }));
    hl::set_cap(previous);
  }
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

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 256;
  int reps = 7;
  bool levels = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::stoul(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--levels") levels = true;
    else {
      std::fprintf(stderr, "usage: %s [--mib M] [--reps R] [--levels]\n", argv[0]);
      return 2;
    }
  }
  // Elements: the largest array (fp32) is `mib` MiB.
  const std::size_t n = mib * 1024 * 1024 / sizeof(float);
  {
    std::vector<char> a(n * sizeof(float), 1), b(n * sizeof(float), 2);
    const stats s = time_reps(reps, [&] { std::memcpy(b.data(), a.data(), a.size()); });
    memcpy_gbs = 2.0 * static_cast<double>(a.size()) / s.median / 1e9;
    std::printf(
        "{\"case\": \"memcpy\", \"bytes\": %zu, \"gbytes_per_s\": %.3f, \"time_s\": {\"median\": %.6f, \"min\": %.6f, "
        "\"max\": %.6f}, \"isa\": \"%s\"}\n",
        a.size(), memcpy_gbs, s.median, s.min, s.max, hl::name(hl::active()));
  }
  all_cases<float>(n, reps, levels, "fp32");
  all_cases<bf16>(n, reps, levels, "bf16");
  return 0;
}
