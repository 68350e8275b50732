// ZeRO++ (engine_options::zeropp): qwZ, qgZ and hpZ against single-process references bit for bit, stages alike, bytes per link level and memory equal to the formulas, refusals.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../deferred_comm.hpp"
#include "../toy_model.hpp"

namespace {

namespace quant = zero::quant;
using zero::mem_category;

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

zero::engine_options with(bool qwz, bool qgz, bool hpz, int node_size, int weight_bits = 8, int grad_bits = 8) {
  zero::engine_options o;
  o.zeropp.qwz = qwz;
  o.zeropp.qgz = qgz;
  o.zeropp.hpz = hpz;
  o.zeropp.node_size = node_size;
  o.zeropp.weights = {weight_bits, 64};  // blocks of 64: the toy's shards hold one to a few
  o.zeropp.gradients = {grad_bits, 64};
  return o;
}

// x quantized and dequantized in place, `count` values at a time (one rank's slice each).
void round_trip(std::vector<float>& x, std::size_t count, const quant::format& f) {
  std::vector<std::uint8_t> wire(quant::wire_bytes(count, f));
  for (std::size_t at = 0; at < x.size(); at += count) {
    quant::quantize(zero::sys::host{}, x.data() + at, count, f, wire.data());
    quant::dequantize(zero::sys::host{}, wire.data(), count, f, x.data() + at);
  }
}
std::vector<float> dequantized(const std::vector<float>& x, const quant::format& f) {
  std::vector<float> y = x;
  round_trip(y, x.size(), f);
  return y;
}

// The reference of ZeRO++ on the toy model, in one process, written from the definitions: per unit
// (padded), the weights every rank computes with are each rank slice's quantized round trip (qwZ) or
// exact; rank r's gradient is toy::gradient at those weights; the reduced gradient of slice k is the
// rank-ordered fp32 sum of the ranks' slices, each quantized on its own (qgZ), or, with nodes of g
// ranks, the node-ordered sum of the quantized node sums, each the local-ordered sum of the quantized
// slices; then AdamW on the exact master weights. With qgZ's error feedback, rank r quantizes its
// slice plus the error its last quantization of that slice left (fp32), and keeps the new error.
// With replicated shard groups (o.shard_group_size = S < n) all of that is each group's, at S ranks
// (the layout padded as at n, nodes of the group), and the groups' sums of a slice are added in group
// order.
std::vector<float> reference(int n, int steps, const zero::engine_options& o) {
  const zero::model_spec s = toy::spec();
  const int group = o.shard_group_size == 0 ? n : o.shard_group_size;
  const zero::layout l = zero::layout::make(s, group, n);
  const auto N = static_cast<std::size_t>(group), R = static_cast<std::size_t>(n / group);
  const auto G = static_cast<std::size_t>(o.zeropp.node_size == 0 ? group : o.zeropp.node_size), K = N / G;
  const bool two_hops = o.zeropp.qgz && G > 1 && G < N;
  const zero::optim::adamw opt;
  const auto bases = toy::unit_bases(s);
  std::vector<std::vector<float>> w(l.num_units()), m1(l.num_units()), m2(l.num_units());
  // [unit][rank]: the rank's carried quantization error over the unit's padded elements.
  std::vector<std::vector<std::vector<float>>> error(l.num_units());
  for (std::size_t u = 0; u < l.num_units(); ++u)
    error[u].assign(N * R, std::vector<float>(l.unit(zero::unit_id{u}).padded, 0.0f));
  for (std::size_t u = 0; u < l.num_units(); ++u) {
    const auto& ul = l.unit(zero::unit_id{u});
    w[u].assign(ul.padded, 0.0f);
    m1[u].assign(ul.padded, 0.0f);
    m2[u].assign(ul.padded, 0.0f);
    for (std::size_t j = 0; j < ul.numel; ++j) w[u][j] = toy::initial(bases[u] + j);
  }
  for (int t = 0; t < steps; ++t) {
    const auto c = opt.constants(static_cast<std::uint64_t>(t) + 1);
    for (std::size_t u = 0; u < l.num_units(); ++u) {
      const auto& ul = l.unit(zero::unit_id{u});
      const std::size_t S = ul.shard;
      std::vector<float> view = w[u];
      if (o.zeropp.qwz) round_trip(view, S, o.zeropp.weights);
      std::vector<std::vector<float>> g(N * R, std::vector<float>(ul.padded, 0.0f));
      for (std::size_t r = 0; r < N * R; ++r)
        for (std::size_t j = 0; j < ul.numel; ++j)
          g[r][j] = toy::gradient(view[j], static_cast<int>(r), static_cast<std::uint64_t>(t), bases[u] + j);
      std::vector<float> sum(ul.padded, 0.0f);
      for (std::size_t k = 0; k < N; ++k) {  // slice k, owned by rank k of each group
        // Group q's sum of slice k (its ranks q N .. q N + N - 1).
        const auto group_sum = [&](std::size_t q) {
          auto slice = [&](std::size_t local) {
            const std::size_t r = q * N + local;
            std::vector<float> x(g[r].begin() + static_cast<std::ptrdiff_t>(k * S),
                                 g[r].begin() + static_cast<std::ptrdiff_t>((k + 1) * S));
            if (!o.zeropp.qgz) return x;
            if (!o.zeropp.qgz_error_feedback) return dequantized(x, o.zeropp.gradients);
            float* e = error[u][r].data() + k * S;
            for (std::size_t i = 0; i < S; ++i) x[i] = e[i] + x[i];
            const std::vector<float> sent = dequantized(x, o.zeropp.gradients);
            for (std::size_t i = 0; i < S; ++i) e[i] = x[i] - sent[i];
            return sent;
          };
          std::vector<float> acc(S);
          if (!two_hops) {
            acc = slice(0);
            for (std::size_t r = 1; r < N; ++r) {
              const auto x = slice(r);
              for (std::size_t i = 0; i < S; ++i) acc[i] += x[i];
            }
          } else {
            for (std::size_t node = 0; node < K; ++node) {
              std::vector<float> part = slice(node * G);
              for (std::size_t lr = 1; lr < G; ++lr) {
                const auto x = slice(node * G + lr);
                for (std::size_t i = 0; i < S; ++i) part[i] += x[i];
              }
              part = dequantized(part, o.zeropp.gradients);
              if (node == 0) acc = part;
              else
                for (std::size_t i = 0; i < S; ++i) acc[i] += part[i];
            }
          }
          return acc;
        };
        std::vector<float> total = group_sum(0);
        for (std::size_t q = 1; q < R; ++q) {
          const std::vector<float> x = group_sum(q);
          for (std::size_t i = 0; i < S; ++i) total[i] += x[i];
        }
        std::copy(total.begin(), total.end(), sum.begin() + static_cast<std::ptrdiff_t>(k * S));
      }
      for (std::size_t j = 0; j < ul.numel; ++j) {
        float st[2] = {m1[u][j], m2[u][j]};
        zero::optim::adamw::update(c, w[u][j], sum[j] / static_cast<float>(n), st);
        m1[u][j] = st[0];
        m2[u][j] = st[1];
      }
    }
  }
  std::vector<float> out;
  for (std::size_t u = 0; u < l.num_units(); ++u)
    out.insert(out.end(), w[u].begin(), w[u].begin() + static_cast<std::ptrdiff_t>(l.unit(zero::unit_id{u}).numel));
  return out;
}

constexpr int steps = 3;

}  // namespace

TEST_CASE("qwZ: stage 3 computes with every rank slice's dequantized weights and keeps the master weights exact") {
  for (int n : {1, 2, 4})
    for (int bits : {8, 4}) {
      CAPTURE(n);
      CAPTURE(bits);
      const auto o = with(true, false, false, 0, bits);
      const auto r = toy::run<zero::stage3>(n, steps, zero::optim::adamw{}, o);
      CHECK(bit_equal(r.params, reference(n, steps, o)));
      CHECK_FALSE(bit_equal(r.params, toy::reference(n, steps, zero::optim::adamw{})));  // the quantization shows
    }
}

TEST_CASE("qwZ: gather(u) returns each rank slice's quantized round trip, the same on every rank") {
  const int n = 4;
  const auto o = with(true, false, false, 0);
  std::vector<std::vector<float>> exact(n), seen(n);
  zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> plain(c, toy::spec());
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> q(c, toy::spec(), {}, o);
    plain.initialize(toy::initializer());
    q.initialize(toy::initializer());
    const auto r = static_cast<std::size_t>(c.rank());
    for (std::size_t u = 0; u < toy::spec().num_units(); ++u) {
      auto a = plain.gather(zero::unit_id{u});
      auto b = q.gather(zero::unit_id{u});
      const auto& ul = plain.layout().unit(zero::unit_id{u});
      std::vector<float> full(a.view().data(), a.view().data() + ul.padded);
      round_trip(full, ul.shard, o.zeropp.weights);
      exact[r].insert(exact[r].end(), full.begin(), full.end());
      seen[r].insert(seen[r].end(), b.view().data(), b.view().data() + ul.padded);
    }
  });
  for (int r = 0; r < n; ++r) {
    CHECK(bit_equal(seen[static_cast<std::size_t>(r)], exact[0]));
    CHECK(bit_equal(seen[static_cast<std::size_t>(r)], seen[0]));
  }
}

TEST_CASE("qgZ: stages 1, 2 and 3 give the same bits, those of the quantized slices summed in rank order") {
  for (const auto& ng : std::vector<std::pair<int, int>>{{2, 0}, {4, 0}, {4, 2}, {4, 1}}) {
    const int n = ng.first, g = ng.second;
    for (int bits : {8, 4}) {
      CAPTURE(n);
      CAPTURE(g);
      CAPTURE(bits);
      const auto o = with(false, true, false, g, 8, bits);
      const auto ref = reference(n, steps, o);
      const auto s1 = toy::run<zero::stage1>(n, steps, zero::optim::adamw{}, o);
      const auto s2 = toy::run<zero::stage2>(n, steps, zero::optim::adamw{}, o);
      const auto s3 = toy::run<zero::stage3>(n, steps, zero::optim::adamw{}, o);
      CHECK(bit_equal(s1.params, ref));
      CHECK(bit_equal(s2.params, ref));
      CHECK(bit_equal(s3.params, ref));
    }
  }
  // Two hops sum in another order than one: nodes of 2 are not the flat sum.
  CHECK_FALSE(bit_equal(reference(4, steps, with(false, true, false, 2)), reference(4, steps, with(false, true, false, 0))));
}

TEST_CASE("qgZ with error feedback: each rank's error carried into its next slice, stages 1-3 alike") {
  for (const auto& ng : std::vector<std::pair<int, int>>{{2, 0}, {4, 0}, {4, 2}}) {
    const int n = ng.first, g = ng.second;
    CAPTURE(n);
    CAPTURE(g);
    auto o = with(false, true, false, g, 8, 4);
    o.zeropp.qgz_error_feedback = true;
    const int t = 4;  // the error of step 1 joins step 2's slices, and so on
    const auto ref = reference(n, t, o);
    CHECK(bit_equal(toy::run<zero::stage1>(n, t, zero::optim::adamw{}, o).params, ref));
    CHECK(bit_equal(toy::run<zero::stage2>(n, t, zero::optim::adamw{}, o).params, ref));
    CHECK(bit_equal(toy::run<zero::stage3>(n, t, zero::optim::adamw{}, o).params, ref));
    // The feedback changes what is sent: not plain qgZ's bits.
    CHECK_FALSE(bit_equal(ref, reference(n, t, with(false, true, false, g, 8, 4))));
  }
  // Fused buckets carry each unit's error as its own reduce does.
  auto fused = with(false, true, false, 0, 8, 4);
  fused.zeropp.qgz_error_feedback = true;
  fused.reduce_bucket_elements = 1 << 20;
  CHECK(bit_equal(toy::run<zero::stage2>(4, 4, zero::optim::adamw{}, fused).params, reference(4, 4, fused)));
}

TEST_CASE("hpZ: the secondary partition changes no bit: hpZ = stage 3, qwZ + hpZ = qwZ, all three = the reference") {
  for (const auto& ng : std::vector<std::pair<int, int>>{{2, 1}, {4, 2}, {4, 1}}) {
    const int n = ng.first, g = ng.second;
    CAPTURE(n);
    CAPTURE(g);
    const zero::optim::adamw a;
    CHECK(bit_equal(toy::run<zero::stage3>(n, steps, a, with(false, false, true, g)).params, toy::reference(n, steps, a)));
    CHECK(bit_equal(toy::run<zero::stage3>(n, steps, a, with(true, false, true, g)).params,
                    reference(n, steps, with(true, false, false, 0))));
    const auto all = with(true, true, true, g);
    CHECK(bit_equal(toy::run<zero::stage3>(n, steps, a, all).params, reference(n, steps, all)));
  }
}

TEST_CASE("ZeRO++ with overlap on a nonblocking backend: the same bits, prefetches (secondary ones too) taken") {
  for (const auto& o : {with(true, true, true, 2), with(true, true, false, 0), with(false, true, true, 1)}) {
    CAPTURE(o.zeropp.qwz);
    CAPTURE(o.zeropp.hpz);
    CAPTURE(o.zeropp.node_size);
    auto on = o, off = o;
    off.overlap = false;
    const auto a = toy::run<zero::stage3, zero::optim::adamw, zero::precision::fp32, testing::deferred>(4, 4, {}, on);
    const auto b = toy::run<zero::stage3>(4, 4, zero::optim::adamw{}, off);
    CHECK(bit_equal(a.params, b.params));
    CHECK(bit_equal(a.params, reference(4, 4, o)));
    for (const auto& c : a.comm) CHECK(c.last_step.total_bytes() == a.comm_formula);
  }
  // The prefetch counts of plain stage 3 (2 x units - 1 per step after the first), hpZ's secondary
  // gathers included: the backward pass's first one starts once its forward gather has completed.
  for (const bool hpz : {false, true}) {
    CAPTURE(hpz);
    zero::comm::threads::launch(4, [&](zero::comm::threads& base) {
      testing::deferred<zero::comm::threads> c(base);
      zero::engine<zero::stage3, testing::deferred<zero::comm::threads>, zero::optim::adamw> e(
          c, toy::spec(), {}, with(true, true, hpz, 2));
      e.initialize(toy::initializer());
      for (int t = 0; t < 4; ++t) toy::train_step(e, c.rank(), static_cast<std::uint64_t>(t));
      CHECK(e.overlap().prefetches == 3 * 7);
      CHECK(e.overlap().prefetch_hits == 3 * 7);
      CHECK(e.overlap().prefetch_misses == 0);
    });
  }
  // bf16, with the reduce bucket fused over units: qgZ quantizes each unit's part on its own.
  auto fused = with(true, true, true, 2);
  fused.reduce_bucket_elements = 4096;
  auto plain = with(true, true, true, 2);
  using bf16 = zero::precision::bf16;
  const auto a = toy::run<zero::stage3, zero::optim::adamw, bf16, testing::deferred>(4, 4, {}, fused);
  const auto b = toy::run<zero::stage3, zero::optim::adamw, bf16>(4, 4, {}, plain);
  CHECK(bit_equal(a.params, b.params));
}

// ---- bytes per link level and memory, against the formulas written out here ------------------------

namespace {

// Independent of zero::formula: per unit (shard S, padded P), the bytes of each collective, sent to
// the N - 1 peers of which N - G are on other nodes (see core/link_formulas.hpp for the definitions).
struct expected_bytes {
  std::uint64_t total = 0, inter = 0;
};
expected_bytes expected(int stage, int n, const zero::engine_options& o, std::size_t c, int m) {
  const zero::layout l = zero::layout::make(toy::spec(), n);
  const auto N = static_cast<std::uint64_t>(n);
  const std::uint64_t G = o.zeropp.node_size == 0 ? N : static_cast<std::uint64_t>(o.zeropp.node_size), K = N / G;
  const auto M = static_cast<std::uint64_t>(m);
  expected_bytes e;
  for (const auto& ul : l.units()) {
    const std::uint64_t S = ul.shard, P = ul.padded;
    const std::uint64_t ww = quant::wire_bytes(S, o.zeropp.weights), wg = quant::wire_bytes(S, o.zeropp.gradients);
    // The reduce of each micro-batch.
    if (!o.zeropp.qgz) {
      e.total += M * (N - 1) * S * c;
      e.inter += M * (N - G) * S * c;
    } else if (G == 1 || G == N) {
      e.total += M * (N - 1) * wg;
      e.inter += M * (N - G) * wg;
    } else {
      e.total += M * ((G - 1) * K * wg + (K - 1) * wg);
      e.inter += M * (K - 1) * wg;
    }
    if (stage < 3) {
      e.total += (N - 1) * S * c;
      e.inter += (N - G) * S * c;
      continue;
    }
    const std::uint64_t gather = o.zeropp.qwz ? ww : S * c, gathers = 2 * M;
    const std::uint64_t primaries = o.zeropp.hpz ? 1 : gathers;
    e.total += primaries * (N - 1) * gather + (gathers - primaries) * (G - 1) * (P / G) * c;
    e.inter += primaries * (N - G) * gather;
  }
  return e;
}

// Trains M micro-batches per step (each a forward and a backward pass of toy::train_step's kind) and
// returns rank 0's last step, formulas and memory.
template <class Stage, class Prec = zero::precision::fp32>
struct measured {
  zero::comm::comm_stats last;
  zero::formula::link_bytes formula;
  std::uint64_t comm_formula = 0, state_formula = 0;
  zero::memory_report memory;
};
template <class Stage, class Prec = zero::precision::fp32>
measured<Stage, Prec> measure(int n, const zero::engine_options& o) {
  measured<Stage, Prec> out;
  zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
    zero::engine<Stage, zero::comm::threads, zero::optim::adamw, Prec> e(c, toy::spec(), {}, o);
    e.initialize(toy::initializer());
    const auto& s = e.spec();
    for (int step = 0; step < 2; ++step) {
      for (int mb = 0; mb < o.micro_batches; ++mb) {
        for (std::size_t u = 0; u < s.num_units(); ++u) e.gather(zero::unit_id{u}).release();
        for (std::size_t u = s.num_units(); u-- > 0;) {
          auto p = e.gather(zero::unit_id{u});
          auto g = e.grads(zero::unit_id{u});
          const auto gv = g.view();
          for (std::size_t j = 0; j < gv.size(); ++j)
            gv.data()[j] = static_cast<typename Prec::grad_type>(0.25f * static_cast<float>(c.rank() + 1));
          e.reduce(zero::unit_id{u});
        }
      }
      e.step();
    }
    if (c.rank() == 0) {
      out.last = e.comm().last_step;
      out.formula = e.comm_formula_by_level();
      out.comm_formula = e.comm_formula_bytes();
      out.state_formula = e.model_state_formula_bytes();
      out.memory = e.memory();
    }
  });
  return out;
}

template <class Stage, class Prec = zero::precision::fp32>
void check_levels(int n, const zero::engine_options& o) {
  CAPTURE(Stage::stage);
  CAPTURE(n);
  CAPTURE(o.zeropp.qwz);
  CAPTURE(o.zeropp.qgz);
  CAPTURE(o.zeropp.hpz);
  CAPTURE(o.zeropp.node_size);
  CAPTURE(o.micro_batches);
  const auto m = measure<Stage, Prec>(n, o);
  const auto e = expected(Stage::stage, n, o, sizeof(typename Prec::comm_type), o.micro_batches);
  CHECK(m.last.total_bytes() == e.total);
  CHECK(m.last.inter_node_bytes() == e.inter);
  CHECK(m.formula.total == e.total);
  CHECK(m.formula.inter == e.inter);
  CHECK(m.comm_formula == e.total);
  CHECK(m.memory.model_state_bytes() == m.state_formula);
}

}  // namespace

TEST_CASE("bytes per link level equal the formulas for every technique and combination") {
  for (int n : {2, 4}) {
    for (int g : {0, 1, 2}) {
      if (g == 2 && n == 2) continue;  // one node of 2: the same as g = 0
      for (int mask = 0; mask < 8; ++mask) {
        const bool qwz = mask & 1, qgz = mask & 2, hpz = mask & 4;
        if (hpz && g == 0) continue;  // hpZ needs nodes
        const auto o = with(qwz, qgz, hpz, g, 8, 4);
        check_levels<zero::stage3>(n, o);
        if (!qwz && !hpz) {
          check_levels<zero::stage1>(n, o);
          check_levels<zero::stage2>(n, o);
        }
      }
    }
    check_levels<zero::stage0>(n, with(false, false, false, n == 4 ? 2 : 1));  // stage 0 by level
  }
  // bf16 on the wire, and two micro-batches: the step's first gather of a unit is hpZ's only primary one.
  auto two = with(true, true, true, 2);
  two.micro_batches = 2;
  check_levels<zero::stage3>(4, two);
  check_levels<zero::stage3, zero::precision::bf16>(4, with(true, true, true, 2, 8, 4));
}

TEST_CASE("the target: all three cut stage 3's inter-node bytes from 3 Psi to at most 0.75 Psi") {
  // bf16, N = 8 on 2 nodes of 4, blocks of 256: the formula alone (a model of 8 units of 1 Mi).
  const std::vector<zero::formula::unit_extent> units(8, zero::formula::unit_extent{1 << 20, 1});
  zero::formula::traffic_options none{}, all{true, true, true, {8, 256}, {4, 256}, 4};
  none.node_size = 4;
  const auto base = zero::formula::bytes_per_step(3, units, 8, 2, 1, none);
  const auto z = zero::formula::bytes_per_step(3, units, 8, 2, 1, all);
  const std::uint64_t psi_bytes = 8ull * (1 << 20) * 2;
  CHECK(base.total == 3 * psi_bytes / 8 * 7);  // 3 Psi (N-1)/N
  CHECK(base.inter == 3 * psi_bytes / 2);      // half the peers are on the other node
  // Per unit (S = 128 Ki per rank): qwZ's forward gather to the 4 peers on the other node, int8 codes
  // and a scale per 256; hpZ's backward gather stays in the node; qgZ's second hop, int4, to 1 peer.
  const std::uint64_t S = (1 << 20) / 8;
  CHECK(z.inter == 8 * (4 * (S + 4 * S / 256) + (S / 2 + 4 * S / 256)));
  CHECK(4 * z.inter <= 3 * psi_bytes);  // <= 0.75 Psi (bf16 bytes): 0.286 Psi
  CHECK(5 * z.inter <= base.inter);     // under a fifth of what stage 3 sends between nodes without them (0.19)
}

TEST_CASE("memory: hpZ's secondary shard is Psi/node_size params; quantized wires are transient") {
  const int n = 4;
  const zero::layout l = zero::layout::make(toy::spec(), n);
  std::size_t largest = 0;
  for (const auto& ul : l.units()) largest = std::max(largest, ul.padded);
  const auto plain = measure<zero::stage3>(n, with(false, false, false, 0));
  const auto hpz = measure<zero::stage3>(n, with(false, false, true, 2));
  CHECK(hpz.memory.bytes(mem_category::params) == plain.memory.bytes(mem_category::params) + l.padded() / 2 * 4);
  CHECK(hpz.state_formula == plain.state_formula + l.padded() / 2 * 4);
  // The transient peak: a unit gathered and its bucket; qgZ adds its two wires during reduce(u).
  CHECK(plain.memory.peak_bytes(mem_category::transient) == 2 * largest * 4);
  const auto qgz = measure<zero::stage3>(n, with(false, true, false, 0));
  CHECK(qgz.memory.peak_bytes(mem_category::transient) ==
        2 * largest * 4 + 2 * n * quant::wire_bytes(largest / n, quant::format{8, 64}));
  CHECK(qgz.memory.bytes(mem_category::transient) == 0);
  // qwZ's N wires beside the gathered unit: with a scale per value (4 + 1 bytes per element) the gather,
  // 4 P + 5 P, outweighs the backward's unit and bucket, 4 P + 4 P.
  auto one = with(true, false, false, 0);
  one.zeropp.weights.block = 1;
  const auto qwz = measure<zero::stage3>(n, one);
  CHECK(qwz.memory.peak_bytes(mem_category::transient) == largest * 4 + n * quant::wire_bytes(largest / n, one.zeropp.weights));
  CHECK(quant::wire_bytes(largest / n, one.zeropp.weights) == 5 * largest / n);
  // qgZ's error feedback keeps an fp32 error per element of the padded model, in the gradient category.
  auto feedback = with(false, true, false, 0);
  feedback.zeropp.qgz_error_feedback = true;
  const auto ef = measure<zero::stage3>(n, feedback);
  CHECK(ef.memory.bytes(mem_category::grads) == qgz.memory.bytes(mem_category::grads) + l.padded() * 4);
  CHECK(ef.state_formula == qgz.state_formula + l.padded() * 4);
}

TEST_CASE("ZeRO++ options that mean nothing, or a backend without what they need, are refused naming the setting") {
  auto refused = [](auto stage_tag, int n, const zero::engine_options& o) {
    using Stage = decltype(stage_tag);
    std::string what;
    try {
      zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
        zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(c, toy::spec(), {}, o);
      });
    } catch (const zero::error& e) {
      CHECK(e.kind() == zero::error_kind::invalid_argument);
      what = e.what();
    }
    return what;
  };
  CHECK(refused(zero::stage2{}, 2, with(true, false, false, 0)).find("qwZ quantizes the parameter all-gathers of stage "
                                                                      "3; ZeRO stage 2 gathers no parameters") !=
        std::string::npos);
  CHECK(refused(zero::stage1{}, 2, with(false, false, true, 1)).find("hpZ keeps a secondary partition") != std::string::npos);
  CHECK(refused(zero::stage0{}, 2, with(false, true, false, 0)).find("qgZ replaces the gradient reduce-scatter of "
                                                                      "stages 1-3; ZeRO stage 0") != std::string::npos);
  CHECK(refused(zero::stage3{}, 4, with(false, false, false, 3)).find("node_size 3 does not divide the world size 4") !=
        std::string::npos);
  CHECK(refused(zero::stage3{}, 4, with(false, false, true, 0)).find("hpZ needs nodes smaller than the world") !=
        std::string::npos);
  CHECK(refused(zero::stage3{}, 4, with(false, false, true, 4)).find("got node_size 4") != std::string::npos);
  // Every rank refuses; the error rethrown is the first rank's to fail, whichever that is.
  const std::string bits = refused(zero::stage3{}, 2, with(true, false, false, 0, 5));
  CHECK(bits.rfind("rank ", 0) == 0);
  CHECK(bits.find(": engine_options::zeropp.weights: quantization bits must be 8 or 4, got 5") != std::string::npos);
  auto odd = with(false, true, false, 0, 8, 4);
  odd.zeropp.gradients.block = 63;
  CHECK(refused(zero::stage3{}, 2, odd).find("int4 packs two values per byte") != std::string::npos);
  auto feedback_alone = with(false, false, false, 0);
  feedback_alone.zeropp.qgz_error_feedback = true;
  CHECK(refused(zero::stage3{}, 2, feedback_alone).find("qgz_error_feedback compensates qgZ's quantization: it needs "
                                                        "qgz") != std::string::npos);
  CHECK(refused(zero::stage3{}, 2, with(false, false, false, 0)).empty());
}

TEST_CASE("ZeRO++ inside replicated shard groups: each group's ZeRO++ at S ranks, the groups' sums added in order") {
  struct config {
    int n, s, g;  // ranks, shard group, node size (0: one node of the group)
  };
  for (const config k : {config{4, 2, 0}, config{8, 4, 2}, config{8, 4, 1}}) {
    CAPTURE(k.n);
    CAPTURE(k.s);
    CAPTURE(k.g);
    const zero::optim::adamw a;
    auto qgz = with(false, true, false, k.g, 8, 4);
    qgz.shard_group_size = k.s;
    const auto ref = reference(k.n, steps, qgz);
    CHECK(bit_equal(toy::run<zero::stage1>(k.n, steps, a, qgz).params, ref));
    CHECK(bit_equal(toy::run<zero::stage3>(k.n, steps, a, qgz).params, ref));
    auto feedback = qgz;
    feedback.zeropp.qgz_error_feedback = true;
    CHECK(bit_equal(toy::run<zero::stage2>(k.n, 4, a, feedback).params, reference(k.n, 4, feedback)));
    auto all = with(true, true, k.g > 0, k.g, 8, 4);  // hpZ needs nodes smaller than the group
    all.shard_group_size = k.s;
    CHECK(bit_equal(toy::run<zero::stage3>(k.n, steps, a, all).params, reference(k.n, steps, all)));
    // The counters, the formulas and the plan agree, per link level too (the replicas' link is inter-node).
    for (const zero::engine_options& o : {qgz, all}) {
      CAPTURE(o.zeropp.qwz);
      const auto m = measure<zero::stage3>(k.n, o);
      CHECK(m.last.total_bytes() == m.comm_formula);
      CHECK(m.formula.total == m.comm_formula);
      CHECK(m.last.inter_node_bytes() == m.formula.inter);
      CHECK(m.memory.model_state_bytes() == m.state_formula);
      const zero::plan_report p = zero::plan_for<zero::stage3, zero::optim::adamw, zero::precision::fp32>(toy::spec(), k.n, o);
      CHECK(p.step_comm.total_bytes() == m.last.total_bytes());
      CHECK(p.peak_bytes == m.memory.peak_total);
    }
  }
  // The groups' sums are not one group's: the option changes the bits.
  auto grouped = with(false, true, false, 0, 8, 4);
  grouped.shard_group_size = 2;
  CHECK_FALSE(bit_equal(reference(4, steps, grouped), reference(4, steps, with(false, true, false, 0, 8, 4))));
}
