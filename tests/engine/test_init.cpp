// Range initialization: each rank fills only what it keeps, bit for bit what whole-tensor initialization gives.
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../../examples/mlp.hpp"
#include "../toy_model.hpp"

namespace {

// One call of a range initializer, as it was made.
struct call {
  int rank;
  std::string tensor;  // unit.tensor
  zero::range elements;
  std::size_t span_size;
};

enum class mode { full, ranges, ranges_broadcast };

// Everything an engine holds after initialization, as bytes, per rank: the parameters of every unit
// as the protocol hands them out (param_type, so bf16 parameters are compared too), the fp32 master
// weights of full_params(), their param_hash, and the master weights and optimizer slots each rank
// holds (read_state over held_range).
struct snapshot {
  std::vector<std::vector<unsigned char>> params, states;
  std::vector<std::vector<float>> full;
  std::vector<std::uint64_t> hash;
  std::vector<std::size_t> transient_peak;  // right after initialize()
};

template <class T>
void append_bytes(std::vector<unsigned char>& out, const T* p, std::size_t n) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

template <class Engine>
void take(Engine& e, snapshot& s, std::size_t r) {
  for (std::size_t u = 0; u < e.spec().num_units(); ++u) {
    auto g = e.gather(zero::unit_id{u});
    append_bytes(s.params[r], g.view().data(), g.view().size());
    g.release();
    const zero::range h = e.held_range(zero::unit_id{u});
    std::vector<float> master(h.size());
    std::vector<std::vector<float>> slots(Engine::optimizer::slots, std::vector<float>(h.size()));
    std::vector<float*> slot_ptrs;
    for (auto& k : slots) slot_ptrs.push_back(k.data());
    e.read_state(zero::unit_id{u}, h, master.data(), slot_ptrs.data());
    append_bytes(s.states[r], master.data(), master.size());
    for (auto& k : slots) append_bytes(s.states[r], k.data(), k.size());
  }
  s.full[r] = e.full_params();
  s.hash[r] = zero::fnv1a64(s.full[r].data(), s.full[r].size() * sizeof(float));
}

template <class Stage, class Prec>
snapshot run(int n, mode m, std::size_t chunk, std::vector<call>* calls = nullptr, int train_steps = 0) {
  snapshot s;
  s.params.resize(static_cast<std::size_t>(n));
  s.states.resize(static_cast<std::size_t>(n));
  s.full.resize(static_cast<std::size_t>(n));
  s.hash.resize(static_cast<std::size_t>(n));
  s.transient_peak.resize(static_cast<std::size_t>(n));
  std::mutex calls_mutex;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine_options o;
    o.init_chunk_elements = chunk;
    zero::engine<Stage, zero::comm::threads, zero::optim::adamw, Prec> e(comm, toy::spec(), {}, o);
    const int rank = comm.rank();
    const zero::init_range_fn values = toy::range_initializer();
    auto fn = [&](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
      if (calls) {
        const std::lock_guard<std::mutex> lock(calls_mutex);
        calls->push_back({rank, u.name + "." + t.name, r, v.size()});
      }
      values(u, t, r, v);
    };
    if (m == mode::full)
      e.initialize(toy::initializer());
    else
      e.initialize(zero::init_range_fn(fn),
                   m == mode::ranges ? zero::init_source::every_rank : zero::init_source::broadcast_from_rank0);
    const auto r = static_cast<std::size_t>(rank);
    s.transient_peak[r] = e.memory().peak_bytes(zero::mem_category::transient);
    for (int t = 0; t < train_steps; ++t) toy::train_step(e, rank, static_cast<std::uint64_t>(t));
    take(e, s, r);
  });
  return s;
}

bool same(const snapshot& a, const snapshot& b, int n) {
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    CAPTURE(r);
    if (a.params[r] != b.params[r] || a.states[r] != b.states[r] || a.hash[r] != b.hash[r]) return false;
    if (a.full[r].size() != b.full[r].size() ||
        std::memcmp(a.full[r].data(), b.full[r].data(), a.full[r].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

template <class Stage, class Prec>
void check_equal_to_full(int n) {
  CAPTURE(n);
  CAPTURE(Stage::stage);
  const snapshot full = run<Stage, Prec>(n, mode::full, 1);
  REQUIRE(full.full[0].size() == toy::spec().numel());
  // Chunks of 7 elements cut every tensor but the one-element ones into pieces, and the pieces do
  // not line up with the shard boundaries; the default chunk covers every tensor in one piece.
  for (std::size_t chunk : {std::size_t{7}, zero::engine_options{}.init_chunk_elements}) {
    CAPTURE(chunk);
    CHECK(same(run<Stage, Prec>(n, mode::ranges, chunk), full, n));
    CHECK(same(run<Stage, Prec>(n, mode::ranges_broadcast, chunk), full, n));
  }
}

template <class Prec>
void check_every_stage_and_n() {
  for (int n : {1, 2, 3, 4, 8}) {
    check_equal_to_full<zero::stage0, Prec>(n);
    check_equal_to_full<zero::stage1, Prec>(n);
    check_equal_to_full<zero::stage2, Prec>(n);
    check_equal_to_full<zero::stage3, Prec>(n);
  }
}

// How many times each real element of the model was asked for, per rank: counts[rank][global index].
std::vector<std::vector<int>> coverage(const std::vector<call>& calls, int n) {
  const zero::model_spec s = toy::spec();
  std::vector<std::vector<int>> counts(static_cast<std::size_t>(n), std::vector<int>(s.numel(), 0));
  for (const call& c : calls) {
    std::size_t base = 0;
    bool found = false;
    for (const auto& u : s.units())
      for (const auto& t : u.tensors) {
        if (u.name + "." + t.name == c.tensor) {
          REQUIRE(c.elements.end <= t.numel);
          for (std::size_t i = c.elements.begin; i < c.elements.end; ++i)
            ++counts[static_cast<std::size_t>(c.rank)][base + i];
          found = true;
        }
        if (!found) base += t.numel;
      }
    REQUIRE(found);
  }
  return counts;
}

}  // namespace

TEST_CASE("range initialization equals whole-tensor initialization bit for bit: fp32, every stage, N = 1-8") {
  check_every_stage_and_n<zero::precision::fp32>();
}

TEST_CASE("range initialization equals whole-tensor initialization bit for bit: bf16, every stage, N = 1-8") {
  check_every_stage_and_n<zero::precision::bf16>();
}

TEST_CASE("range initialization equals whole-tensor initialization bit for bit: fp16 at N = 3") {
  check_equal_to_full<zero::stage1, zero::precision::fp16>(3);
  check_equal_to_full<zero::stage3, zero::precision::fp16>(3);
}

TEST_CASE("after range initialization training continues exactly as after whole-tensor initialization") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    CHECK(same(run<zero::stage1, zero::precision::bf16>(n, mode::ranges, 5, nullptr, 3),
               run<zero::stage1, zero::precision::bf16>(n, mode::full, 1, nullptr, 3), n));
    CHECK(same(run<zero::stage3, zero::precision::fp32>(n, mode::ranges, 5, nullptr, 3),
               run<zero::stage3, zero::precision::fp32>(n, mode::full, 1, nullptr, 3), n));
  }
}

TEST_CASE_TEMPLATE("each rank is asked for exactly the elements it keeps, in spans of at most the chunk", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
      CAPTURE(chunk);
      std::vector<call> calls;
      run<Stage, zero::precision::bf16>(n, mode::ranges, chunk, &calls);
      for (const call& c : calls) {
        CHECK(c.span_size == c.elements.size());  // the span is the range: nothing else can be written
        CHECK(c.span_size >= 1);
        CHECK(c.span_size <= chunk);
      }
      // Stage 0 keeps everything on every rank; stages 1-3 keep (and so produce) only the owned
      // slice: over the ranks, every element exactly once.
      const auto counts = coverage(calls, n);
      const zero::layout l = zero::layout::make(toy::spec(), n);
      std::size_t base = 0;
      for (std::size_t u = 0; u < l.num_units(); ++u) {
        const zero::unit_layout& ul = l.unit(zero::unit_id{u});
        for (int r = 0; r < n; ++r) {
          const zero::range own = l.owned_real(zero::unit_id{u}, r);
          for (std::size_t i = 0; i < ul.numel; ++i) {
            const bool keeps = Stage::stage == 0 || (i >= own.begin && i < own.end);
            if (counts[static_cast<std::size_t>(r)][base + i] != (keeps ? 1 : 0)) {
              FAIL_CHECK("rank ", r, " unit ", u, " element ", i, " asked for ",
                         counts[static_cast<std::size_t>(r)][base + i], " times");
              return;
            }
          }
        }
        base += ul.numel;
      }
    }
  }
}

TEST_CASE("broadcast_from_rank0: only rank 0 produces values, each element once, and staging is one chunk") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<call> calls;
    const std::size_t chunk = 16;
    const snapshot s = run<zero::stage3, zero::precision::bf16>(n, mode::ranges_broadcast, chunk, &calls);
    for (const call& c : calls) CHECK(c.rank == 0);
    const auto counts = coverage(calls, n);
    for (int c : counts[0]) CHECK(c == 1);
    // The only transient buffer initialization allocates is the chunk-sized broadcast buffer.
    for (std::size_t peak : s.transient_peak) CHECK(peak == chunk * sizeof(float));
  }
}

TEST_CASE("the example's generator gives the same model through ranges as through whole tensors") {
  mlp::config c;
  c.layers = 3;
  c.hidden = 40;
  c.in = 12;
  c.classes = 5;
  const zero::model_spec spec = mlp::make_spec(c);
  const zero::init_range_fn ranges = mlp::initializer(c);
  const zero::init_fn whole = [&](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
    ranges(u, t, zero::range{0, v.size()}, v);
  };
  std::vector<float> want, got;
  std::uint64_t streamed = 0;
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage0, zero::comm::threads, zero::optim::adamw> e(comm, spec);
    e.initialize(whole);
    want = e.full_params();
  });
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    zero::engine_options o;
    o.init_chunk_elements = 33;
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, spec, {}, o);
    e.initialize(ranges);
    auto p = e.full_params();
    const std::uint64_t h = mlp::param_hash(e);
    if (comm.rank() == 0) {
      got = std::move(p);
      streamed = h;
    }
  });
  REQUIRE(want.size() == spec.numel());
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  // The trainers' unit-by-unit hash is the hash of the whole parameter vector.
  CHECK(streamed == zero::fnv1a64(want.data(), want.size() * sizeof(float)));
}

TEST_CASE("a chunk of zero elements is refused") {
  zero::comm::threads::launch(1, [](zero::comm::threads& comm) {
    zero::engine_options o;
    o.init_chunk_elements = 0;
    using engine = zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw>;
    CHECK_THROWS_WITH_AS(engine(comm, toy::spec(), {}, o), doctest::Contains("init_chunk_elements must be > 0, got 0"),
                         zero::error);
  });
}

// ---- every_rank initialization checks that the ranks agree ----

namespace {

// toy's values, except that `tensor` (unit.tensor) gets a different value at element 5 on `odd_rank`.
zero::init_fn diverging(int rank, const std::string& tensor, int odd_rank) {
  return [=](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
    toy::initializer()(u, t, v);
    if (rank == odd_rank && u.name + "." + t.name == tensor) v[std::min<std::size_t>(5, v.size() - 1)] += 1.0f;
  };
}
zero::init_range_fn diverging_ranges(int rank, const std::string& tensor, int odd_rank) {
  return [=](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    toy::range_initializer()(u, t, r, v);
    if (rank == odd_rank && u.name + "." + t.name == tensor)
      for (float& x : v) x = -x;
  };
}

// Runs initialize on n ranks; returns each rank's error message ("" where it returned).
template <class Stage, class Init>
std::vector<std::string> init_errors(int n, Init make, zero::init_source source = zero::init_source::every_rank) {
  std::vector<std::string> out(static_cast<std::size_t>(n));
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec());
    try {
      e.initialize(make(comm.rank()), source);
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::invalid_argument);
      out[static_cast<std::size_t>(comm.rank())] = x.what();
    }
  });
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("every_rank whole-tensor initialization that differs by rank fails on every rank, naming the "
                   "first tensor that differs and the ranks",
                   Stage, zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    const int odd = n - 1;
    // block.b and head.w differ on the last rank: block.b comes first in declaration order.
    const auto errors = init_errors<Stage>(n, [&](int rank) {
      const zero::init_fn a = diverging(rank, "block.b", odd), b = diverging(rank, "head.w", odd);
      return zero::init_fn([a, b](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
        if (u.name == "head") b(u, t, v);
        else a(u, t, v);
      });
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const std::string& m = errors[static_cast<std::size_t>(r)];
      CHECK(m.find("rank " + std::to_string(r) + ": initialize (init_source::every_rank): unit 'block', tensor 'b': "
                   "rank(s) " + std::to_string(odd) + " produced other values than rank 0") == 0);
      CHECK(m.find("head") == std::string::npos);
      CHECK(m.find("broadcast_from_rank0") != std::string::npos);
    }
  }
  // Two ranks out of four, listed.
  const auto errors = init_errors<Stage>(4, [](int rank) {
    return zero::init_fn([rank](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
      toy::initializer()(u, t, v);
      if (u.name == "tiny" && (rank == 1 || rank == 3)) v[0] = static_cast<float>(rank);
    });
  });
  for (const auto& m : errors) CHECK(m.find("unit 'tiny', tensor 'scale': rank(s) 1, 3 produced") != std::string::npos);
}

TEST_CASE("every_rank range initialization is checked where ranks produce the same values: stage 0") {
  for (std::size_t chunk : {std::size_t{7}, zero::engine_options{}.init_chunk_elements}) {
    CAPTURE(chunk);
    std::vector<std::string> errors(3);
    zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
      zero::engine_options o;
      o.init_chunk_elements = chunk;
      zero::engine<zero::stage0, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, o);
      try {
        e.initialize(diverging_ranges(comm.rank(), "embed.w", 1));
      } catch (const zero::error& x) {
        errors[static_cast<std::size_t>(comm.rank())] = x.what();
      }
    });
    for (int r = 0; r < 3; ++r)
      CHECK(errors[static_cast<std::size_t>(r)].find("rank " + std::to_string(r) +
                                                     ": initialize (init_source::every_rank): unit 'embed', tensor "
                                                     "'w': rank(s) 1 produced") == 0);
  }
}

// Stages 1-3 ask each element of exactly one rank (its owner): a function that differs by rank
// cannot make ranks disagree there, so nothing is checked and every rank computes with what
// full_params() reports.
TEST_CASE_TEMPLATE("every_rank range initialization in stages 1-3: each value has one producer, nothing to disagree",
                   Stage, zero::stage1, zero::stage2, zero::stage3) {
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec());
    e.initialize(diverging_ranges(comm.rank(), "embed.w", 1));
    CHECK(e.comm().other.calls[static_cast<std::size_t>(zero::comm::collective::all_gather)] ==
          (Stage::stage == 3 ? 0u : e.spec().num_units()));  // the parameter refresh only, no check
    const auto full = e.full_params();
    std::size_t at = 0;
    for (std::size_t u = 0; u < e.spec().num_units(); ++u) {
      auto g = e.gather(zero::unit_id{u});
      CHECK(std::memcmp(g.view().data(), full.data() + at, g.view().size() * sizeof(float)) == 0);
      at += g.view().size();
    }
  });
}

TEST_CASE("agreeing every_rank initialization passes; the check costs one all-gather of 16 bytes per tensor, in "
          "comm().other") {
  const std::size_t tensors = 7;  // toy::spec()
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
      zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec());
      e.initialize(toy::initializer());
      const auto other = e.comm().other;
      const auto ag = static_cast<std::size_t>(zero::comm::collective::all_gather);
      // Bus volume of an all-gather of N x 16 T bytes: (N - 1) x 16 T per rank. None at N = 1.
      CHECK(other.calls[ag] == (n > 1 ? 1u : 0u));
      CHECK(other.bytes[ag] == static_cast<std::uint64_t>(n - 1) * 16 * tensors);
      CHECK(other.total_bytes() == other.bytes[ag]);
      // Outside memory(): no transient buffer.
      CHECK(e.memory().peak_bytes(zero::mem_category::transient) == 0);
    });
  }
}

TEST_CASE("broadcast_from_rank0 needs no check: a function that differs by rank gives rank 0's values everywhere") {
  for (int stage_n : {2, 3}) {
    const auto errors = init_errors<zero::stage1>(stage_n, [](int rank) { return diverging(rank, "head.b", 1); },
                                                  zero::init_source::broadcast_from_rank0);
    for (const auto& m : errors) CHECK(m.empty());
  }
}

TEST_CASE("verify_init = false skips the check: no traffic, and a diverging function goes unnoticed") {
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    zero::engine_options o;
    o.verify_init = false;
    zero::engine<zero::stage0, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, o);
    e.initialize(diverging(comm.rank(), "block.b", 2));
    CHECK(e.comm().other.total_bytes() == 0);
  });
}

// The check's hash (run_hash64: XXH3, or the word-wise fallback where xxHash is absent): every byte and
// the length count, and a chained hash depends on the chunks' order.
TEST_CASE("run_hash64 and its word-wise fallback see every byte, the length and the chaining order") {
  std::vector<unsigned char> bytes(37);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 29 + 3);
  using hash_fn = std::uint64_t (*)(const void*, std::size_t, std::uint64_t);
  const hash_fn run = [](const void* p, std::size_t n, std::uint64_t s) { return zero::run_hash64(p, n, s); };
  for (const hash_fn hash : {run, &zero::detail::wordwise_hash64}) {
    const std::uint64_t whole = hash(bytes.data(), bytes.size(), 0);
    for (std::size_t i = 0; i < bytes.size(); ++i) {  // one bit flipped anywhere, the tail included
      bytes[i] ^= 1;
      CHECK(hash(bytes.data(), bytes.size(), 0) != whole);
      bytes[i] ^= 1;
    }
    CHECK(hash(bytes.data(), bytes.size() - 1, 0) != whole);
    const std::uint64_t ab = hash(bytes.data() + 20, 17, hash(bytes.data(), 20, 0));
    const std::uint64_t ba = hash(bytes.data(), 20, hash(bytes.data() + 20, 17, 0));
    CHECK(ab != ba);
  }
}
