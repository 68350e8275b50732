// optim::muon: the Newton-Schulz orthogonalization against a double reference, and the engine's matrix exchange
// (owners, bytes, the same bits in every stage and at every N, a checkpoint resharded).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../global_batch.hpp"
#include "../plain_threads.hpp"
#include "../threads_runner.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/comm/all_to_all.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/engine/matrix_owners.hpp"
#include "zero/optim/muon.hpp"
#include "zero/sys/host_products.hpp"
#include "zero/zero.hpp"

namespace {

using zero::comm::threads;
using zero::optim::muon;
using zero::optim::newton_schulz;

// The published iteration, written again in double from its equations (not from the library's code):
// X = G / (||G||_F + 1e-7), transposed where rows > cols; five times A = X X^T, B = b A + c A^2, X = a X + B X.
std::vector<double> reference_orthogonalize(const std::vector<double>& g, std::size_t rows, std::size_t cols) {
  const bool tall = rows > cols;
  const std::size_t n = tall ? cols : rows, m = tall ? rows : cols;
  std::vector<double> x(n * m);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) (tall ? x[j * m + i] : x[i * m + j]) = g[i * cols + j];
  double norm = 0.0;
  for (double v : x) norm += v * v;
  norm = std::sqrt(norm) + 1e-7;
  for (double& v : x) v /= norm;
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  for (int s = 0; s < 5; ++s) {
    std::vector<double> A(n * n, 0.0), B(n * n, 0.0), next(n * m, 0.0);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t k = 0; k < m; ++k) A[i * n + j] += x[i * m + k] * x[j * m + k];
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double aa = 0.0;
        for (std::size_t k = 0; k < n; ++k) aa += A[i * n + k] * A[k * n + j];
        B[i * n + j] = b * A[i * n + j] + c * aa;
      }
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) {
        double bx = 0.0;
        for (std::size_t k = 0; k < n; ++k) bx += B[i * n + k] * x[k * m + j];
        next[i * m + j] = a * x[i * m + j] + bx;
      }
    x = next;
  }
  std::vector<double> out(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) out[i * cols + j] = tall ? x[j * m + i] : x[i * m + j];
  return out;
}

std::vector<float> test_matrix(std::size_t rows, std::size_t cols, float seed) {
  std::vector<float> g(rows * cols);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::sin(seed + 0.731f * static_cast<float>(i * i % 97));
  return g;
}

// The largest |fp32 - double| over the entries, and the largest entry of the reference.
struct deviation {
  double worst = 0.0, largest = 0.0;
};
deviation compare(const std::vector<float>& got, const std::vector<double>& want) {
  deviation d;
  for (std::size_t i = 0; i < got.size(); ++i) {
    d.worst = std::max(d.worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    d.largest = std::max(d.largest, std::fabs(want[i]));
  }
  return d;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(), [](float u, float v) {
           return std::bit_cast<std::uint32_t>(u) == std::bit_cast<std::uint32_t>(v);
         });
}

using testing::threads_runner;

}  // namespace

TEST_CASE("Newton-Schulz in fp32 is within 2e-6 of the iteration in double, wide, tall and square") {
  // The documented bound (docs/api.md, optim::muon): five iterations of fp32 products of order n or m
  // each; the entries of the result are below about 1.
  struct shape {
    std::size_t rows, cols;
  };
  for (const shape s : {shape{3, 5}, shape{7, 4}, shape{16, 16}, shape{48, 10}, shape{1, 9}, shape{64, 96}}) {
    CAPTURE(s.rows);
    CAPTURE(s.cols);
    std::vector<float> x = test_matrix(s.rows, s.cols, static_cast<float>(s.rows));
    const std::vector<double> want = reference_orthogonalize(std::vector<double>(x.begin(), x.end()), s.rows, s.cols);
    newton_schulz::workspace w;
    newton_schulz::orthogonalize(x.data(), s.rows, s.cols, w);
    const deviation d = compare(x, want);
    CHECK(d.worst <= 2e-6);
    CHECK(d.largest > 0.1);  // not a zero result compared with a zero reference
    MESSAGE(s.rows, "x", s.cols, ": largest deviation ", d.worst);
  }
}

TEST_CASE("Newton-Schulz: the host's products on packs give the order's bits, at every ISA, however rows are split") {
  const std::size_t rows = 24, cols = 43;  // 43: packs and a tail of single lanes
  const std::vector<float> g = test_matrix(rows, cols, 0.5f);
  std::vector<float> one = g;
  newton_schulz::workspace w;
  newton_schulz::orthogonalize(one.data(), rows, cols, w);  // newton_schulz::ordered_products, element by element
  const auto split = [](std::size_t n, auto&& f) {
    for (std::size_t b = 0; b < n; b += 5) f(b, std::min(n, b + 5));  // uneven pieces of rows
  };
  const zero::sys::host_loop::isa best = zero::sys::host_loop::active();
  for (int level = 0; level <= static_cast<int>(best); ++level) {
    CAPTURE(level);
    const auto cap = zero::sys::host_loop::set_cap(static_cast<zero::sys::host_loop::isa>(level));
    // min_parallel_madds 0: these small products go through the runner too.
    std::vector<float> packed = g;
    newton_schulz::orthogonalize(packed.data(), rows, cols, w, zero::sys::host_products{split, 0});
    CHECK(same_bits(one, packed));
    for (int parts : {1, 2, 3}) {
      CAPTURE(parts);
      packed = g;
      newton_schulz::orthogonalize(packed.data(), rows, cols, w, zero::sys::host_products{threads_runner{parts}, 0});
      CHECK(same_bits(one, packed));
    }
    packed = g;  // the default: products this small on the calling thread
    newton_schulz::orthogonalize(packed.data(), rows, cols, w, zero::sys::host_products{split});
    CHECK(same_bits(one, packed));
    zero::sys::host_loop::set_cap(cap);
  }
  // The norm divides the scale out: a power-of-two multiple of the input gives the same result.
  std::vector<float> scaled = g;
  for (float& v : scaled) v *= 8.0f;
  newton_schulz::orthogonalize(scaled.data(), rows, cols, w);
  CHECK(std::equal(one.begin(), one.end(), scaled.begin()));
  // An all-zero matrix stays zero (the 1e-7 keeps the division finite).
  std::vector<float> zeros(rows * cols, 0.0f);
  newton_schulz::orthogonalize(zeros.data(), rows, cols, w);
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("host products: the order's bits on awkward shapes and special values, at every ISA and thread split") {
  // n x k x m: single elements, shapes below a tile (8 x 32 on AVX-512, 6 x 16 AVX2, 6 x 8 SSE2, 4 x 4
  // scalar), past one, and k past the block of 256 values of q (a partial sum stored and reloaded).
  struct shape {
    std::size_t n, k, m;
  };
  const std::uint32_t specials[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                                    0x80000000u, 0x00000001u, 0x7f7fffffu, 0xff7fffffu};
  for (const shape s : {shape{1, 1, 1}, shape{3, 5, 5}, shape{5, 3, 3}, shape{17, 33, 9}, shape{9, 260, 40},
                        shape{14, 2, 70}, shape{4, 0, 6}}) {
    CAPTURE(s.n);
    CAPTURE(s.k);
    CAPTURE(s.m);
    std::vector<float> a = test_matrix(s.n, s.k, 0.25f), b = test_matrix(s.k, s.m, 1.5f);
    // -0 in both; NaNs with payloads, infinities, the largest finite and a subnormal in A's last row and
    // B's last column (their results special, the others ordinary sums).
    for (std::size_t i = 0; i < a.size(); i += 7) a[i] = -0.0f;
    for (std::size_t i = 0; i < b.size(); i += 5) b[i] = -0.0f;
    for (std::size_t q = 0; q < s.k; ++q) {
      a[(s.n - 1) * s.k + q] = std::bit_cast<float>(specials[q % std::size(specials)]);
      b[q * s.m + s.m - 1] = std::bit_cast<float>(specials[(q + 3) % std::size(specials)]);
    }
    std::vector<float> want(s.n * s.m, 1.0f);
    newton_schulz::ordered_products{}.multiply(a.data(), b.data(), want.data(), s.n, s.k, s.m);
    const zero::sys::host_loop::isa best = zero::sys::host_loop::active();
    for (int level = 0; level <= static_cast<int>(best); ++level) {
      CAPTURE(level);
      const auto cap = zero::sys::host_loop::set_cap(static_cast<zero::sys::host_loop::isa>(level));
      for (int parts : {1, 2, 3}) {
        CAPTURE(parts);
        std::vector<float> c(s.n * s.m, 3.0f);
        zero::sys::host_products{threads_runner{parts}, 0}.multiply(a.data(), b.data(), c.data(), s.n, s.k, s.m);
        CHECK(same_bits(c, want));
      }
      zero::sys::host_loop::set_cap(cap);
    }
  }
}

TEST_CASE("muon: hyper-parameters are validated, naming the field") {
  muon o;
  o.momentum = 1.0f;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("optim::muon: momentum"), zero::error);
  o = muon{};
  o.eps = 0.0f;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("optim::muon: eps"), zero::error);
  o = muon{};
  o.adamw_lr_scale = -1.0f;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("optim::muon: adamw_lr_scale"), zero::error);
}

namespace {

// A model with matrices (wide, tall, square), 1-D tensors and an embedding kept on AdamW by its group.
zero::model_spec muon_model() {
  zero::model_spec s;
  s.unit("embed").tensor("wte", {37, 12}).group("embedding");
  s.unit("block").tensor("w1", {12, 40}).tensor("b1", {40}).group("no_decay").tensor("w2", {40, 12}).tensor("g", {12});
  s.unit("head").tensor("w", {12, 12}).tensor("b", {12}).group("no_decay");
  return s;
}
std::vector<zero::param_group> muon_recipe() {
  return {{.name = "no_decay", .weight_decay = 0.0f}, {.name = "embedding", .lr_scale = 0.1f, .element_wise = true}};
}
muon muon_settings() {
  muon o;
  o.lr = 0.05f;
  o.weight_decay = 0.02f;
  return o;
}

using testing::global_step;
using testing::init_values;

zero::engine_options muon_options(int ranks, bool reproducible) {
  zero::engine_options eo;
  eo.param_groups = muon_recipe();
  eo.reproducible = reproducible;
  eo.micro_batches = reproducible ? 12 / ranks : 1;
  eo.clip_norm = 0.5f;
  return eo;
}

template <class Stage, class Prec = zero::precision::fp32>
std::vector<float> trained(int ranks, bool reproducible, int steps = 3, zero::offload_options offload = {}) {
  zero::engine_options eo = muon_options(ranks, reproducible);
  eo.offload = offload;
  std::vector<float> out;
  threads::launch(ranks, [&](threads& c) {
    zero::engine<Stage, threads, muon, Prec> e(c, muon_model(), muon_settings(), eo);
    e.initialize(init_values);
    for (int s = 0; s < steps; ++s) global_step(e, c.rank(), s);
    const std::vector<float> p = e.full_params();
    if (c.rank() == 0) out = p;
  });
  return out;
}

}  // namespace

TEST_CASE("muon: every stage trains the same bits at N = 1..4 reproducibly, and at a fixed N without") {
  const auto one = trained<zero::stage0>(1, true);
  REQUIRE(!one.empty());
  for (int ranks : {1, 2, 3, 4}) {
    CAPTURE(ranks);
    CHECK(trained<zero::stage0>(ranks, true) == one);
    CHECK(trained<zero::stage1>(ranks, true) == one);
    CHECK(trained<zero::stage2>(ranks, true) == one);
    CHECK(trained<zero::stage3>(ranks, true) == one);
  }
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    const auto s0 = trained<zero::stage0>(ranks, false);
    CHECK(trained<zero::stage1>(ranks, false) == s0);
    CHECK(trained<zero::stage2>(ranks, false) == s0);
    CHECK(trained<zero::stage3>(ranks, false) == s0);
    const auto b0 = trained<zero::stage0, zero::precision::bf16>(ranks, false);
    CHECK(trained<zero::stage3, zero::precision::bf16>(ranks, false) == b0);
  }
}

TEST_CASE("muon: offloaded states, in host memory or on disk in slices that cut the matrices, give the same bits") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero_test_muon_offload";
  std::filesystem::create_directories(dir);
  for (int ranks : {1, 3}) {
    CAPTURE(ranks);
    const auto in_memory = trained<zero::stage3>(ranks, false);
    zero::offload_options host{.tier = zero::offload_tier::host, .directory = "", .slice_elements = 1024};
    CHECK(trained<zero::stage3>(ranks, false, 3, host) == in_memory);
    zero::offload_options disk{.tier = zero::offload_tier::disk, .directory = dir.string(), .slice_elements = 1024};
    CHECK(trained<zero::stage1>(ranks, false, 3, disk) == in_memory);
    CHECK(trained<zero::stage0>(ranks, false, 3, disk) == in_memory);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("muon: one engine step equals the published update computed in double, matrix and element-wise tensors") {
  // One rank, one step from zero momentum, a known gradient: the head's 12 x 12 matrix by Muon, its bias
  // by AdamW with lr x adamw_lr_scale, both against a double computation of the equations.
  const muon o = muon_settings();
  std::vector<float> before, after, grad;
  threads::launch(1, [&](threads& c) {
    zero::engine_options eo;
    eo.param_groups = muon_recipe();
    zero::engine<zero::stage1, threads, muon> e(c, muon_model(), o, eo);
    e.initialize(init_values);
    before = e.full_params();
    for (std::size_t u = e.spec().units().size(); u-- > 0;) {
      const zero::unit_id id{u};
      auto g = e.grads(id);
      for (std::size_t j = 0; j < e.layout().unit(id).numel; ++j)
        g.view().data()[j] = std::cos(0.9f * static_cast<float>(j) + static_cast<float>(u));
      e.reduce(id);
    }
    e.step();
    after = e.full_params();
  });
  // The head unit's elements in the flat parameters: after embed (444) and block (480 + 40 + 480 + 12).
  const std::size_t head = 444 + 1012;
  std::vector<double> u(144);
  const double mu = o.momentum;
  for (std::size_t j = 0; j < 144; ++j) {
    const double g = std::cos(0.9f * static_cast<float>(j) + 2.0f);
    const double m = (1.0 - mu) * g;
    u[j] = (1.0 - mu) * g + mu * m;  // Nesterov
  }
  const std::vector<double> orth = reference_orthogonalize(u, 12, 12);
  double worst = 0.0;
  for (std::size_t j = 0; j < 144; ++j) {
    const double w = before[head + j];
    const double want = (1.0 - static_cast<double>(o.lr) * o.weight_decay) * w - static_cast<double>(o.lr) * orth[j];
    worst = std::max(worst, std::fabs(after[head + j] - want));
  }
  // lr 0.05 times the orthogonalization's deviation, which here includes the fp32 roundings of u: the
  // quintic's slope at 0 is a = 3.4445, so a small singular direction's rounding grows up to a^5 = 490 times.
  CHECK(worst <= 1e-6);
  // The bias (group no_decay: AdamW without weight decay), first step: m^ / (sqrt(v^) + eps) = g / (|g| + eps).
  for (std::size_t j = 0; j < 12; ++j) {
    const double g = std::cos(0.9f * static_cast<float>(144 + j) + 2.0f);
    const double lr = static_cast<double>(o.lr) * o.adamw_lr_scale;
    const double want = before[head + 144 + j] - lr * g / (std::fabs(g) + o.eps);
    CHECK(std::fabs(after[head + 144 + j] - want) <= 1e-7);
  }
  // The embedding (element_wise group, lr x 0.1 on top) moved by AdamW's first step: lr x sign(g).
  const double embed_lr = static_cast<double>(o.lr) * 0.1 * o.adamw_lr_scale;
  CHECK(std::fabs(std::fabs(after[0] - before[0] * (1.0 - embed_lr * o.weight_decay)) - embed_lr) <= 1e-7);
}

TEST_CASE("muon: owners are balanced by work, and the exchange moves the bytes its formula gives") {
  const zero::model_spec spec = muon_model();
  for (int ranks : {1, 2, 3, 4}) {
    CAPTURE(ranks);
    // Measured: the control link's bytes of one Muon step, less those of an AdamW step with the same options.
    const auto control_bytes = [&]<class Stage, class Opt>(Opt opt, std::uint64_t* formula) {
      std::uint64_t bytes = 0;
      threads::launch(ranks, [&](threads& c) {
        zero::engine_options eo;
        eo.param_groups = {{.name = "no_decay", .weight_decay = 0.0f}, {.name = "embedding", .lr_scale = 0.1f}};
        if constexpr (std::is_same_v<Opt, muon>) eo.param_groups[1].element_wise = true;
        zero::engine<Stage, threads, Opt> e(c, spec, opt, eo);
        e.initialize(init_values);
        const std::uint64_t before = e.comm().control.total_bytes();
        const zero::step_report r = global_step(e, c.rank(), 0);
        // The step's own report of the exchange, on every rank: the formula's bytes (none for AdamW).
        CHECK(r.optimizer_exchange.total_bytes() == e.optimizer_exchange_formula_bytes());
        if (c.rank() == 0) {
          bytes = e.comm().control.total_bytes() - before;
          if (formula) *formula = e.optimizer_exchange_formula_bytes();
        }
      });
      return bytes;
    };
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(Stage::stage);
      std::uint64_t formula = 0;
      const std::uint64_t with_muon = control_bytes.template operator()<Stage>(muon_settings(), &formula);
      const std::uint64_t with_adamw = control_bytes.template operator()<Stage>(zero::optim::adamw{}, nullptr);
      CHECK((formula > 0) == (ranks > 1));
      CHECK(with_muon - with_adamw == formula);
    });
  }
  // Owners: the four matrices (block w1 and w2 of equal work, head w, and the embedding kept on AdamW).
  const zero::layout lay = zero::layout::make(spec, 2);
  const zero::matrix_owners owners(spec, lay, [](std::size_t u, std::size_t) { return u != 0; });
  REQUIRE(owners.matrices(zero::unit_id{0}).empty());
  REQUIRE(owners.matrices(zero::unit_id{1}).size() == 2);
  REQUIRE(owners.matrices(zero::unit_id{2}).size() == 1);
  CHECK(owners.matrices(zero::unit_id{1})[0].owner != owners.matrices(zero::unit_id{1})[1].owner);
  CHECK(owners.work_of(0) == zero::matrix_owners::work(12, 40) + zero::matrix_owners::work(12, 12));
  CHECK(owners.work_of(1) == zero::matrix_owners::work(40, 12));
  CHECK(owners.block(zero::unit_id{1}) == 480);
  // Stage 0 holds whole matrices: the results' all-gather only; one rank: no exchange.
  CHECK(owners.exchange_bytes(lay, false, true) ==
        zero::comm::bus_bytes(zero::comm::collective::all_gather, 2 * 480 * sizeof(float), 2) +
            zero::comm::bus_bytes(zero::comm::collective::all_gather, 2 * 144 * sizeof(float), 2));
  const zero::layout one = zero::layout::make(spec, 1);
  CHECK(zero::matrix_owners(spec, one, [](std::size_t, std::size_t) { return true; }).exchange_bytes(one, true, true) ==
        0);
  // Sharded states: each rank sends an owner only the elements it holds of the owner's matrices, and gets
  // their results back (two all_to_alls of N pair blocks), instead of gathering the unit and every result.
  for (std::size_t u : {1, 2}) {
    const zero::unit_id id{u};
    std::size_t most = 0;  // the most one rank holds of one owner's matrices, counted by hand
    for (int r = 0; r < 2; ++r)
      for (int o = 0; o < 2; ++o) {
        std::size_t held = 0;
        for (const zero::matrix_entry& m : owners.matrices(id))
          if (m.owner == o) held += zero::intersect(m.elements, lay.owned(id, r)).size();
        most = std::max(most, held);
      }
    CHECK(owners.pair_block(id) == most);
    CHECK(owners.pair_block(id) < lay.unit(id).shard + 1);
  }
  std::uint64_t to_owners = 0, gathers = 0;
  for (std::size_t u : {1, 2}) {
    const zero::unit_id id{u};
    to_owners += 2 * zero::comm::bus_bytes(zero::comm::collective::all_to_all, 2 * owners.pair_block(id) * 4, 2);
    gathers += zero::comm::bus_bytes(zero::comm::collective::all_gather, lay.unit(id).padded * 4, 2) +
               zero::comm::bus_bytes(zero::comm::collective::all_gather, 2 * owners.block(id) * 4, 2);
  }
  CHECK(owners.exchange_bytes(lay, true, true) == to_owners);
  CHECK(owners.exchange_bytes(lay, true, false) == gathers);
  CHECK(to_owners < gathers);
}

namespace {

// comm::threads without all_to_all (plain_threads.hpp): the matrices' exchange then gathers each unit whole.
using gathering_threads = zero_test::plain_threads;
static_assert(!zero::comm::has_all_to_all<gathering_threads>);

}  // namespace

TEST_CASE("muon: over a backend without all_to_all the units are gathered instead, with the same bits") {
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    std::vector<float> gathered;
    std::uint64_t measured = 0, formula = 0;
    threads::launch(ranks, [&](threads& t) {
      gathering_threads c(t);
      zero::engine<zero::stage3, gathering_threads, muon> e(c, muon_model(), muon_settings(),
                                                            muon_options(ranks, false));
      e.initialize(init_values);
      for (int s = 0; s < 3; ++s) {
        const zero::step_report r = global_step(e, t.rank(), s);
        CHECK(r.optimizer_exchange.total_bytes() == e.optimizer_exchange_formula_bytes());
        if (t.rank() == 0) measured = r.optimizer_exchange.total_bytes(), formula = e.optimizer_exchange_formula_bytes();
      }
      const std::vector<float> p = e.full_params();
      if (t.rank() == 0) gathered = p;
    });
    CHECK(gathered == trained<zero::stage3>(ranks, false));
    const zero::layout lay = zero::layout::make(muon_model(), ranks);
    const zero::matrix_owners owners(muon_model(), lay, [](std::size_t u, std::size_t) { return u != 0; });
    CHECK(formula == owners.exchange_bytes(lay, true, false));
    CHECK(measured > owners.exchange_bytes(lay, true, true));
  }
}

TEST_CASE("muon: a checkpoint taken at N = 4 stage 3 resumes at N = 2 stage 1 bit for bit, reproducibly") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero_test_muon_checkpoint";
  std::filesystem::remove_all(dir);
  const std::vector<float> uninterrupted = trained<zero::stage3>(4, true, 4);
  threads::launch(4, [&](threads& c) {
    zero::engine<zero::stage3, threads, muon> e(c, muon_model(), muon_settings(), muon_options(4, true));
    e.initialize(init_values);
    for (int s = 0; s < 2; ++s) global_step(e, c.rank(), s);
    zero::checkpoint::save(e, c, dir);
  });
  const zero::checkpoint::manifest m = zero::checkpoint::verify(dir);
  REQUIRE(m.param_groups.size() == 2);
  CHECK(m.param_groups[1].element_wise);
  CHECK_FALSE(m.param_groups[0].element_wise);
  threads::launch(2, [&](threads& c) {
    zero::engine_options eo = muon_options(2, true);
    eo.param_groups = m.param_groups;
    zero::engine<zero::stage1, threads, muon> e(c, muon_model(), zero::checkpoint::optimizer_from<muon>(m), eo);
    zero::checkpoint::load(e, c, dir);
    for (int s = 2; s < 4; ++s) global_step(e, c.rank(), s);
    CHECK(e.full_params() == uninterrupted);
  });
  std::filesystem::remove_all(dir);
}

TEST_CASE("muon: a stack of matrices (..., rows, cols) trains as its matrices declared one by one") {
  // {3, 8, 6} as attention's q, k, v in one tensor, against three {8, 6} tensors: the same elements in the
  // same places, each matrix orthogonalized on its own, so the same bits at N = 3 in stage 2.
  const auto run = [](const zero::model_spec& spec) {
    std::vector<float> out;
    threads::launch(3, [&](threads& c) {
      zero::engine<zero::stage2, threads, muon> e(c, spec, muon_settings());
      // Each element's value from its place in the unit, so that both declarations start alike.
      e.initialize([](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
        std::size_t at = r.begin;
        for (std::size_t k = 0; &u.tensors[k] != &t; ++k) at += u.tensors[k].numel;
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = 0.1f * std::cos(0.77f * static_cast<float>(at + j));
      });
      for (int s = 0; s < 3; ++s) {
        auto g = e.grads(zero::unit_id{0});
        for (std::size_t j = 0; j < g.view().size(); ++j)
          g.view().data()[j] = std::sin(0.3f * static_cast<float>(j * (s + 1)) + static_cast<float>(c.rank()));
        e.reduce(zero::unit_id{0});
        e.step();
      }
      const auto p = e.full_params();
      if (c.rank() == 0) out = p;
    });
    return out;
  };
  zero::model_spec stacked, separate;
  stacked.unit("attn").tensor("qkv", {3, 8, 6}).tensor("b", {18});
  separate.unit("attn").tensor("q", {8, 6}).tensor("k", {8, 6}).tensor("v", {8, 6}).tensor("b", {18});
  const auto a = run(stacked);
  CHECK(a == run(separate));
  zero::model_spec flat;  // as one 24 x 6 matrix instead: other bits
  flat.unit("attn").tensor("qkv", {24, 6}).tensor("b", {18});
  CHECK(a != run(flat));
}

TEST_CASE("muon: element_wise is refused for an optimizer without a matrix rule, naming the group") {
  threads::launch(2, [](threads& c) {
    zero::engine_options eo;
    eo.param_groups = {{.name = "embedding", .element_wise = true}};
    CHECK_THROWS_WITH_AS((zero::engine<zero::stage1, threads, zero::optim::adamw>(c, muon_model(), {}, eo)),
                         doctest::Contains("param_groups['embedding']: element_wise is set, but optim::adamw"),
                         zero::error);
  });
}
