// The device engine on comm::cuda_threads: stage equivalence, equality with the CPU engine, memory formulas from the device allocator.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "device_toy.cuh"
#include "zero/engine/activation_store.hpp"
#include "zero/engine/plan.hpp"

namespace {

using adamw = zero::optim::adamw;
using sgd = zero::optim::sgd;

constexpr int steps = 12;

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return a.size();
}

// fp16 needs a loss scale for the toy gradients (as in test_precision.cpp); the others ignore it.
zero::engine_options toy_options() {
  zero::engine_options o;
  o.loss_scale.initial = 1024.0f;
  return o;
}

adamw toy_adamw() {
  adamw a;
  a.lr = 3e-3f;
  return a;
}

// Every stage on the device, and the host engine on comm::threads, give the same bits.
template <class Prec, class Opt>
void check_device_against_host(Opt opt, zero::engine_options o = toy_options()) {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto host = toy::run<zero::stage0, Opt, Prec>(n, steps, opt, o).params;
    const auto d0 = device_toy::run<zero::stage0, Opt, Prec>(n, steps, opt, o).params;
    const auto d1 = device_toy::run<zero::stage1, Opt, Prec>(n, steps, opt, o).params;
    const auto d2 = device_toy::run<zero::stage2, Opt, Prec>(n, steps, opt, o).params;
    const auto d3 = device_toy::run<zero::stage3, Opt, Prec>(n, steps, opt, o).params;
    REQUIRE(host.size() == toy::spec().numel());
    CHECK_MESSAGE(bit_equal(d0, host), "GPU stage 0 differs from the CPU first at ", first_difference(d0, host));
    CHECK_MESSAGE(bit_equal(d1, d0), "GPU stage 1 differs from stage 0 first at ", first_difference(d1, d0));
    CHECK_MESSAGE(bit_equal(d2, d0), "GPU stage 2 differs from stage 0 first at ", first_difference(d2, d0));
    CHECK_MESSAGE(bit_equal(d3, d0), "GPU stage 3 differs from stage 0 first at ", first_difference(d3, d0));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("GPU: stages 0-3 are bit-identical to each other and to the CPU engine (AdamW)", Prec,
                   zero::precision::fp32, zero::precision::bf16, zero::precision::fp16) {
  check_device_against_host<Prec>(toy_adamw());
}

TEST_CASE_TEMPLATE("GPU: stages 0-3 are bit-identical to each other and to the CPU engine (SGD, Nesterov, decay)",
                   Prec, zero::precision::fp32, zero::precision::bf16) {
  sgd s;
  s.lr = 0.05f;
  s.nesterov = true;
  s.weight_decay = 1e-3f;
  check_device_against_host<Prec>(s);
}

TEST_CASE_TEMPLATE("GPU: ZeRO++ (qwZ, two-hop qgZ, hpZ) on cuda_threads gives the CPU engine's bits; qgZ alike in stages 1-3",
                   Prec, zero::precision::fp32, zero::precision::bf16) {
  // Nodes of 2 in a world of 4: qgZ's two hops and hpZ's node groups (split worlds on one device).
  zero::engine_options o = toy_options();
  o.zeropp.node_size = 2;
  o.zeropp.weights = {8, 64};
  o.zeropp.gradients = {4, 64};
  o.zeropp.qgz = true;
  const auto q1 = device_toy::run<zero::stage1, adamw, Prec>(4, steps, toy_adamw(), o).params;
  const auto q2 = device_toy::run<zero::stage2, adamw, Prec>(4, steps, toy_adamw(), o).params;
  const auto q3 = device_toy::run<zero::stage3, adamw, Prec>(4, steps, toy_adamw(), o).params;
  const auto qh = toy::run<zero::stage3, adamw, Prec>(4, steps, toy_adamw(), o).params;
  CHECK_MESSAGE(bit_equal(q3, qh), "GPU qgZ differs from the CPU first at ", first_difference(q3, qh));
  CHECK(bit_equal(q1, q3));
  CHECK(bit_equal(q2, q3));
  o.zeropp.qwz = o.zeropp.hpz = true;
  const auto all = device_toy::run<zero::stage3, adamw, Prec>(4, steps, toy_adamw(), o).params;
  const auto host = toy::run<zero::stage3, adamw, Prec>(4, steps, toy_adamw(), o).params;
  CHECK_MESSAGE(bit_equal(all, host), "GPU qwZ + qgZ + hpZ differs from the CPU first at ", first_difference(all, host));
}

TEST_CASE("GPU: an fp32 gradient shard (the accumulate kernel, bf16 into fp32) matches the CPU engine") {
  zero::engine_options o = toy_options();
  o.fp32_grad_accumulation = true;
  const auto host = toy::run<zero::stage3, adamw, zero::precision::bf16>(3, steps, toy_adamw(), o).params;
  const auto dev = device_toy::run<zero::stage3, adamw, zero::precision::bf16>(3, steps, toy_adamw(), o).params;
  CHECK_MESSAGE(bit_equal(dev, host), "first difference at ", first_difference(dev, host));
}

// With clipping, the coefficient depends on the global norm, which the GPU sums in CUB's tree order
// and the CPU left to right: the doubles may differ in their last bits. The coefficient is rounded to
// float, so the parameters are almost always identical; where they are not, the difference is one
// rounding of the coefficient per step, far below this bound.
TEST_CASE("GPU: with gradient clipping the parameters match the CPU engine to rounding") {
  zero::engine_options o = toy_options();
  o.clip_norm = 0.05f;
  const auto host = toy::run<zero::stage2, adamw>(2, steps, toy_adamw(), o);
  const auto dev = device_toy::run<zero::stage2, adamw>(2, steps, toy_adamw(), o);
  REQUIRE(host.params.size() == dev.params.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < host.params.size(); ++i) {
    differ += std::memcmp(&host.params[i], &dev.params[i], sizeof(float)) != 0;
    CHECK(std::fabs(host.params[i] - dev.params[i]) <= 1e-6f * std::max(1.0f, std::fabs(host.params[i])));
  }
  MESSAGE(differ, " of ", host.params.size(), " parameters differ in their bits");
  for (std::size_t t = 0; t < host.reports[0].size(); ++t) {
    const double h = host.reports[0][t].grad_norm, d = dev.reports[0][t].grad_norm;
    CHECK(std::fabs(h - d) <= 1e-12 * std::fabs(h));
  }
}

TEST_CASE("GPU: a non-finite gradient on one rank makes every rank skip the step") {
  zero::comm::cuda_threads::launch(3, [](zero::comm::cuda_threads& comm) {
    zero::engine<zero::stage3, zero::comm::cuda_threads, adamw, zero::precision::fp16> e(comm, toy::spec(),
                                                                                          toy_adamw(), toy_options());
    e.initialize(toy::initializer());
    device_toy::train_step(e, comm.rank(), 0);
    const auto before = e.full_params();
    const float scale_before = e.loss_scale();
    for (std::size_t u = e.spec().num_units(); u-- > 0;) {
      const zero::unit_id id{u};
      auto p = e.gather(id);
      auto g = e.grads(id);
      if (comm.rank() == 1 && u == 0) {
        const zero::fp16 inf = zero::fp16::from_bits(0x7c00);
        zero::sys::cuda::copy(g.view().data() + 5, &inf, sizeof inf);
      }
      e.reduce(id);
    }
    const auto r = e.step();
    CHECK(r.skipped);
    CHECK(r.step == 1);                          // the optimizer did not advance
    CHECK(e.loss_scale() == scale_before);       // hysteresis 2 absorbs the first overflow
    CHECK(e.state().skipped_steps == 1);
    CHECK(bit_equal(e.full_params(), before));
  });
}

TEST_CASE_TEMPLATE("GPU: the device allocator holds exactly the engine's bytes, and they equal the formulas", Prec,
                   zero::precision::fp32, zero::precision::bf16) {
  const int n = 4;
  auto check = [&](const device_toy::run_result& r, int stage) {
    CAPTURE(stage);
    for (int k = 0; k < n; ++k) {
      const auto rk = static_cast<std::size_t>(k);
      CAPTURE(k);
      // The engine's accounting and the rank's allocator see the same bytes.
      CHECK(r.device_after_init[rk].live == r.engine_bytes_after_init[rk]);
      CHECK(r.device_after_init[rk].pool_used >= r.device_after_init[rk].live);
      // Persistent model states equal the paper's formula; nothing transient outlives a call.
      CHECK(r.memory[rk].model_state_bytes() == r.model_state_formula);
      CHECK(r.memory[rk].bytes(zero::mem_category::transient) == 0);
      CHECK(r.device[rk].peak >= r.memory[rk].peak_total);
    }
  };
  check(device_toy::run<zero::stage0, adamw, Prec>(n, 2, toy_adamw(), toy_options()), 0);
  check(device_toy::run<zero::stage1, adamw, Prec>(n, 2, toy_adamw(), toy_options()), 1);
  check(device_toy::run<zero::stage2, adamw, Prec>(n, 2, toy_adamw(), toy_options()), 2);
  check(device_toy::run<zero::stage3, adamw, Prec>(n, 2, toy_adamw(), toy_options()), 3);
}

TEST_CASE_TEMPLATE("GPU: release_memory frees the device's model states and restore_memory brings the same bits back",
                   Stage, zero::stage1, zero::stage3) {
  const auto straight = device_toy::run<Stage, adamw, zero::precision::bf16>(2, 4, toy_adamw(), toy_options()).params;
  const auto dir = std::filesystem::temp_directory_path();
  std::vector<float> got;
  zero::comm::cuda_threads::launch(2, [&](zero::comm::cuda_threads& comm) {
    zero::engine<Stage, zero::comm::cuda_threads, adamw, zero::precision::bf16> e(comm, toy::spec(), toy_adamw(),
                                                                                  toy_options());
    e.initialize(toy::initializer());
    for (int t = 0; t < 4; ++t) {
      if (t == 1 || t == 3) {
        const std::size_t live = comm.context().memory().live;
        const std::size_t states = e.memory().model_state_bytes();
        e.release_memory(
            {.to = t == 1 ? zero::release_target::host : zero::release_target::disk, .directory = dir.string()});
        CHECK(e.memory().model_state_bytes() == 0);
        CHECK(comm.context().memory().live == live - states);  // the device allocator gave them back
        e.restore_memory();
        CHECK(comm.context().memory().live == live);
      }
      device_toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    }
    auto p = e.full_params();
    if (comm.rank() == 0) got = std::move(p);
  });
  CHECK(bit_equal(got, straight));
}

TEST_CASE("GPU: ranks sharing the device are counted, and model states N ranks cannot hold are refused up front") {
  zero::comm::cuda_threads::launch(2, [](zero::comm::cuda_threads& comm) {
    const zero::memory_info m = comm.make_system().available();
    CHECK(m.sharers == 2);
    CHECK(m.total > 0);
    CHECK(m.free <= m.total);
    CHECK(m.space == "CUDA device 0");
    // One tensor sized from the free memory: stage 0 needs 16 bytes per parameter on each of the two
    // ranks (4/3 of what is free), stage 3 a quarter of that (2/3 of it).
    zero::model_spec big;
    big.unit("huge").tensor("w", {static_cast<std::size_t>(m.free / 24)});
    std::string what;
    try {
      zero::engine<zero::stage0, zero::comm::cuda_threads, adamw> e(comm, big);
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::out_of_memory);
      what = x.what();
    }
    CAPTURE(what);
    CHECK(what.find("rank " + std::to_string(comm.rank()) + ": out of memory") != std::string::npos);
    CHECK(what.find("CUDA device 0 has ") != std::string::npos);
    CHECK(what.find("shared by 2 ranks of this process") != std::string::npos);
    CHECK(what.find("stage 3 (") != std::string::npos);
    CHECK(what.find("stage 0 (") == std::string::npos);
    CHECK(comm.context().memory().live == 0);  // nothing was allocated
  });
}

TEST_CASE("GPU: range initialization gives the parameters of whole-tensor initialization, bit for bit") {
  auto run = [](auto stage, bool ranges) {
    using Stage = decltype(stage);
    std::vector<std::vector<unsigned char>> out(3);
    zero::comm::cuda_threads::launch(3, [&](zero::comm::cuda_threads& comm) {
      zero::engine_options o = toy_options();
      o.init_chunk_elements = 7;
      zero::engine<Stage, zero::comm::cuda_threads, adamw, zero::precision::bf16> e(comm, toy::spec(), toy_adamw(), o);
      if (ranges) e.initialize(toy::range_initializer());
      else e.initialize(toy::initializer());
      auto& bytes = out[static_cast<std::size_t>(comm.rank())];
      for (std::size_t u = 0; u < e.spec().num_units(); ++u) {  // the bf16 parameters as gathered
        auto p = e.gather(zero::unit_id{u});
        std::vector<unsigned char> host(p.view().size() * sizeof(zero::bf16));
        zero::sys::cuda::copy(host.data(), p.view().data(), host.size());
        bytes.insert(bytes.end(), host.begin(), host.end());
      }
      const auto full = e.full_params();  // the fp32 master weights
      const auto* b = reinterpret_cast<const unsigned char*>(full.data());
      bytes.insert(bytes.end(), b, b + full.size() * sizeof(float));
    });
    return out;
  };
  CHECK(run(zero::stage1{}, true) == run(zero::stage1{}, false));
  CHECK(run(zero::stage3{}, true) == run(zero::stage3{}, false));
}

#if ZERO_WITH_NCCL
namespace {

// The toy model on NCCL ranks, one per device of this machine (in one process).
template <class Stage, class Prec>
std::vector<float> run_on_nccl(const std::vector<int>& devices, int steps_to_run,
                               zero::engine_options options = toy_options()) {
  std::vector<float> params;
  zero::comm::nccl::launch(devices, [&](zero::comm::nccl& comm) {
    zero::engine<Stage, zero::comm::nccl, adamw, Prec> e(comm, toy::spec(), toy_adamw(), options);
    e.initialize(toy::initializer());
    for (int t = 0; t < steps_to_run; ++t) device_toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto full = e.full_params();
    if (comm.rank() == 0) params = std::move(full);
  });
  return params;
}

}  // namespace

TEST_CASE_TEMPLATE("GPU nccl: the engine on NCCL ranks gives the bits of comm::cuda_threads (deterministic mode)", Prec,
                   zero::precision::fp32, zero::precision::bf16) {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  std::vector<int> devices;
  for (int d = 0; d < count && d < 4; ++d) devices.push_back(d);
  const int n = static_cast<int>(devices.size());
  CAPTURE(n);
  const auto ref = device_toy::run<zero::stage0, adamw, Prec>(n, steps, toy_adamw(), toy_options()).params;
  const auto s0 = run_on_nccl<zero::stage0, Prec>(devices, steps);
  const auto s3 = run_on_nccl<zero::stage3, Prec>(devices, steps);
  CHECK_MESSAGE(bit_equal(s0, ref), "NCCL stage 0 differs first at ", first_difference(s0, ref));
  CHECK_MESSAGE(bit_equal(s3, ref), "NCCL stage 3 differs first at ", first_difference(s3, ref));
  // Stage 3's gathers in buckets (gather_bucket_elements), left in flight by NCCL: the same bits.
  zero::engine_options o = toy_options();
  o.gather_bucket_elements = 1000;
  const auto b3 = run_on_nccl<zero::stage3, Prec>(devices, steps, o);
  CHECK_MESSAGE(bit_equal(b3, ref), "NCCL stage 3 with gather buckets differs first at ", first_difference(b3, ref));
}
#endif

// Stage 3's gather buckets on the device: the units the recorded order gathers next, within the budget, in one
// all-gather, their shards copied side by side into a device wire and out into each unit's buffer.
TEST_CASE_TEMPLATE("GPU: stage 3 gather buckets give the bits of unit-by-unit gathers and of the CPU engine", Prec,
                   zero::precision::fp32, zero::precision::bf16) {
  for (bool overlap_on : {false, true})
    for (int n : {2, 4}) {
      CAPTURE(overlap_on);
      CAPTURE(n);
      zero::engine_options o = toy_options();
      o.overlap = overlap_on;
      const auto plain = device_toy::run<zero::stage3, adamw, Prec>(n, steps, toy_adamw(), o);
      o.gather_bucket_elements = 1000;
      const auto bucketed = device_toy::run<zero::stage3, adamw, Prec>(n, steps, toy_adamw(), o);
      const auto host = toy::run<zero::stage3, adamw, Prec>(n, steps, toy_adamw(), o).params;
      CHECK(plain.overlap.gather_buckets == 0);
      CHECK(bucketed.overlap.gather_buckets > 0);
      CHECK(bucketed.overlap.prefetch_misses == 0);
      CHECK_MESSAGE(bit_equal(bucketed.params, plain.params), "buckets differ from unit by unit first at ",
                    first_difference(bucketed.params, plain.params));
      CHECK_MESSAGE(bit_equal(bucketed.params, host), "GPU buckets differ from the CPU first at ",
                    first_difference(bucketed.params, host));
      for (std::size_t r = 0; r < bucketed.memory.size(); ++r)
        CHECK(bucketed.memory[r].bytes(zero::mem_category::transient) == 0);  // every wire freed
    }
}

namespace {

// A layer's checkpoint: any bit pattern (NaNs and subnormals included), different per layer.
template <class T>
std::vector<T> checkpoint_values(std::size_t layer, std::size_t n) {
  std::vector<T> v(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (layer + 1);
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&e, &x, sizeof(T));
  }
  return v;
}

// L checkpoints saved from device memory, brought back in reverse (the next one prefetched while this one is
// "recomputed", when asked), compared bit for bit on the host; the store's memory and traffic against the plan.
template <class T>
void device_checkpoint_loop(int tp, zero::activation_mode mode, bool prefetch_next) {
  CAPTURE(tp);
  CAPTURE(zero::to_string(mode));
  CAPTURE(prefetch_next);
  constexpr std::size_t layers = 3, elements = 1001;  // 1001: the last slice is padded at tp 2 and 4
  const zero::activation_plan plan =
      zero::plan_activations(layers, elements, sizeof(T), tp, mode, prefetch_next);
  std::vector<int> exact(static_cast<std::size_t>(tp), 1);
  std::vector<zero::activation_memory> memory(static_cast<std::size_t>(tp));
  std::vector<zero::activation_traffic> traffic(static_cast<std::size_t>(tp));
  zero::comm::cuda_threads::launch(tp, [&](zero::comm::cuda_threads& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    {
      zero::activation_store<zero::comm::cuda_threads> store(c, mode);
      const std::size_t bytes = elements * sizeof(T);
      void* scratch = zero::sys::cuda::allocate(bytes);
      for (std::size_t l = 0; l < layers; ++l) {
        const auto v = checkpoint_values<T>(l, elements);
        zero::sys::cuda::copy(scratch, v.data(), bytes);
        store.save(l, static_cast<const T*>(scratch), elements);
        zero::sys::cuda::fill_zero(scratch, bytes);  // the store keeps its own copy
      }
      zero::sys::cuda::deallocate(scratch, bytes);
      std::vector<T> back(elements);
      for (std::size_t l = layers; l-- > 0;) {
        const auto view = store.template restore<T>(l);
        if (view.size() != elements) {
          exact[r] = 0;
        } else {
          zero::sys::cuda::copy(back.data(), view.data(), bytes);
          const auto v = checkpoint_values<T>(l, elements);
          exact[r] = exact[r] && std::memcmp(back.data(), v.data(), bytes) == 0;
        }
        if (prefetch_next && l > 0) store.template prefetch<T>(l - 1);
        store.release(l);
      }
      memory[r] = store.memory();
      traffic[r] = store.traffic();
    }
  });
  for (int r = 0; r < tp; ++r) {
    CAPTURE(r);
    const auto i = static_cast<std::size_t>(r);
    CHECK(exact[i] == 1);
    CHECK(memory[i].saved == 0);
    CHECK(memory[i].host == 0);
    CHECK(memory[i].restored == 0);
    CHECK(memory[i].peak_saved == plan.saved_bytes);
    CHECK(memory[i].peak_host == plan.host_bytes);
    CHECK(memory[i].peak_restored == plan.peak_restored_bytes);
    CHECK(traffic[i].gather.total_bytes() == plan.gather.total_bytes());
    CHECK(traffic[i].to_host_bytes == plan.to_host_bytes);
    CHECK(traffic[i].from_host_bytes == plan.from_host_bytes);
  }
}

}  // namespace

// ZeRO-R's Pa and Pa+cpu on the device: slices cut from device memory, kept in device memory or pinned host
// memory, all-gathered back by comm::cuda_threads.
TEST_CASE_TEMPLATE("GPU: the activation store (none, Pa, Pa+cpu) restores device checkpoints bit for bit", T, float,
                   zero::bf16) {
  for (int tp : {1, 2, 4})
    for (zero::activation_mode mode : {zero::activation_mode::none, zero::activation_mode::partitioned,
                                       zero::activation_mode::partitioned_cpu})
      for (bool prefetch_next : {false, true}) device_checkpoint_loop<T>(tp, mode, prefetch_next);
}
