// activation_store: checkpoints kept whole, as tensor-parallel slices (Pa) or in host memory (Pa+cpu), restored bit for
// bit; memory and traffic equal to the formulas and the plan.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "zero/comm/mesh.hpp"
#include "zero/engine/activation_store.hpp"
#include "zero/zero.hpp"

namespace {

using zero::activation_mode;
using zero::comm::mesh;
using zero::comm::threads;

constexpr activation_mode modes[] = {activation_mode::none, activation_mode::partitioned,
                                     activation_mode::partitioned_cpu};

// The activation of a layer on a data-parallel rank: the same on every rank of its tensor-parallel group,
// different across data-parallel ranks and layers; any bit pattern (NaNs and subnormals included).
template <class T>
std::vector<T> activation(int dp_index, std::size_t layer, std::size_t n) {
  std::vector<T> v(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (layer + 1) + static_cast<std::uint64_t>(dp_index) * 0x632be59bd9b4e019ull;
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&e, &x, sizeof(T));
  }
  return v;
}

template <class T>
bool same_bits(std::span<const T> a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), b.size() * sizeof(T)) == 0;
}

struct measured {
  zero::activation_memory memory;
  zero::activation_traffic traffic;
  bool exact = true;
};

// How the backward pass brings checkpoints back: by restore alone, by a prefetch just before it, or by a
// prefetch of the next layer once this one is restored (plan_activations' prefetch_next).
enum class prefetching { none, before_restore, next_layer };

// L layers of E elements saved in the forward pass, restored in reverse and released, on a 2 x tp mesh of
// threads; returns what each world rank's store measured.
template <class T>
std::vector<measured> checkpoint_loop(int tp, activation_mode mode, std::size_t layers, std::size_t elements,
                                      prefetching prefetch = prefetching::none) {
  const int world = 2 * tp;
  std::vector<measured> out(static_cast<std::size_t>(world));
  threads::launch(world, [&](threads& c) {
    mesh<threads> m(c, {.dp = 2, .tp = tp});
    zero::activation_store<threads> store(m.tp(), mode);
    measured& r = out[static_cast<std::size_t>(c.rank())];
    std::vector<std::vector<T>> inputs;
    for (std::size_t l = 0; l < layers; ++l) {
      std::vector<T> scratch = activation<T>(m.coordinates().dp, l, elements);
      store.save(l, scratch.data(), elements);
      scratch.assign(elements, T{});  // the store keeps its own copy: the caller may reuse its buffer
      inputs.push_back(activation<T>(m.coordinates().dp, l, elements));
    }
    for (std::size_t l = layers; l-- > 0;) {
      if (prefetch == prefetching::before_restore) store.template prefetch<T>(l);
      r.exact = r.exact && same_bits(store.template restore<T>(l), inputs[l]);
      // A second restore of the same layer is the same view: no more traffic.
      r.exact = r.exact && same_bits(store.template restore<T>(l), inputs[l]);
      if (prefetch == prefetching::next_layer && l > 0) store.template prefetch<T>(l - 1);
      store.release(l);
    }
    r.memory = store.memory();
    r.traffic = store.traffic();
  });
  return out;
}

template <class T>
void check_against_plan(int tp, activation_mode mode, std::size_t layers, std::size_t elements,
                        prefetching prefetch = prefetching::none) {
  CAPTURE(tp);
  CAPTURE(zero::to_string(mode));
  CAPTURE(elements);
  CAPTURE(static_cast<int>(prefetch));
  const zero::activation_plan p =
      zero::plan_activations(layers, elements, sizeof(T), tp, mode, prefetch == prefetching::next_layer);
  const bool partitioned = mode != activation_mode::none, host = mode == activation_mode::partitioned_cpu;
  const auto f = zero::formula::activation_checkpoint_bytes(layers, elements, sizeof(T), tp, partitioned, host);
  CHECK(p.saved_bytes == f.system);
  CHECK(p.host_bytes == f.host);
  // The formulas written out: whole tensors, or ceil(E / tp) elements per layer.
  const std::uint64_t slice = (elements + static_cast<std::size_t>(tp) - 1) / static_cast<std::size_t>(tp);
  const std::uint64_t kept = partitioned ? slice : elements;
  CHECK(f.system + f.host == layers * kept * sizeof(T));
  CHECK(f.system == (host ? 0 : layers * kept * sizeof(T)));
  const std::uint64_t gather = zero::formula::activation_gather_bytes(layers, elements, sizeof(T), tp, partitioned);
  CHECK(gather == (partitioned ? layers * static_cast<std::uint64_t>(tp - 1) * slice * sizeof(T) : 0));
  for (const measured& r : checkpoint_loop<T>(tp, mode, layers, elements, prefetch)) {
    CHECK(r.exact);
    CHECK(r.memory.saved == 0);
    CHECK(r.memory.host == 0);
    CHECK(r.memory.restored == 0);
    CHECK(r.memory.peak_saved == p.saved_bytes);
    CHECK(r.memory.peak_host == p.host_bytes);
    CHECK(r.memory.peak_restored == p.peak_restored_bytes);
    CHECK(r.memory.peak_system == p.peak_system_bytes);
    CHECK(r.traffic.gather.total_bytes() == gather);
    CHECK(r.traffic.gather[zero::comm::collective::all_gather] == p.gather[zero::comm::collective::all_gather]);
    CHECK(r.traffic.gather.calls == p.gather.calls);
    CHECK(r.traffic.to_host_bytes == p.to_host_bytes);
    CHECK(r.traffic.from_host_bytes == p.from_host_bytes);
    CHECK(r.traffic.to_host_bytes == (host ? layers * slice * sizeof(T) : 0));
    CHECK(r.traffic.saves == layers);
    CHECK(r.traffic.restores == 2 * layers);
    CHECK(r.traffic.prefetches == (prefetch == prefetching::none             ? 0
                                   : prefetch == prefetching::before_restore ? layers
                                                                             : layers - 1));
  }
}

}  // namespace

TEST_CASE(
    "activation_store: none, Pa and Pa+cpu restore bit for bit; memory and traffic equal the formulas and the plan") {
  for (int tp : {1, 2, 4})
    for (activation_mode mode : modes) {
      check_against_plan<float>(tp, mode, 3, 1001);  // 1001 is no multiple of 2 or 4: the last slice is padded
      check_against_plan<float>(tp, mode, 2, 1024);
    }
  // A checkpoint smaller than the group: some ranks keep only padding.
  check_against_plan<float>(4, activation_mode::partitioned, 2, 3);
  check_against_plan<float>(4, activation_mode::partitioned_cpu, 1, 1);
}

TEST_CASE("activation_store: bf16 and fp16 checkpoints, every bit pattern, at tp 2 and 4") {
  for (int tp : {2, 4})
    for (activation_mode mode : modes) {
      check_against_plan<zero::bf16>(tp, mode, 3, 777);
      check_against_plan<zero::fp16>(tp, mode, 2, 513);
    }
}

TEST_CASE("activation_store: prefetch brings a checkpoint back ahead of restore, with the same bytes") {
  for (activation_mode mode : modes) check_against_plan<float>(2, mode, 3, 1001, prefetching::before_restore);
}

TEST_CASE("activation_store: the next layer prefetched during this one's recomputation: same bits, two restores held") {
  for (int tp : {2, 4})
    for (activation_mode mode : modes) {
      check_against_plan<float>(tp, mode, 3, 1001, prefetching::next_layer);
      check_against_plan<zero::bf16>(tp, mode, 1, 77, prefetching::next_layer);  // one layer: nothing to prefetch
    }
  const auto p = zero::plan_activations(4, 1000, 2, 4, activation_mode::partitioned_cpu, true);
  CHECK(p.peak_restored_bytes == 2 * p.restore_bytes);
  CHECK(p.peak_system_bytes == 2 * 1000 * 2);  // Pa+cpu keeps nothing in the system's memory but the two restores
}

TEST_CASE("activation_store: a prefetched layer released or cleared without a restore frees everything") {
  threads::launch(2, [](threads& c) {
    zero::activation_store<threads> store(c, activation_mode::partitioned_cpu);
    const auto a = activation<float>(0, 0, 9);
    store.save(0, a.data(), a.size());
    store.save(1, a.data(), a.size());
    store.prefetch<float>(1);
    store.prefetch<float>(1);  // already on its way: no second all-gather
    CHECK(store.traffic().gather.calls[static_cast<std::size_t>(zero::comm::collective::all_gather)] == 1);
    store.release(1);
    store.prefetch<float>(0);
    store.clear();
    CHECK(store.layers_held() == 0);
    CHECK(store.memory().restored == 0);
    CHECK(store.memory().host == 0);
    CHECK(store.traffic().gather.calls[static_cast<std::size_t>(zero::comm::collective::all_gather)] == 2);
  });
}

TEST_CASE("activation_store: a layer of another size per call; the plan of a uniform loop per size adds up") {
  // Two sizes of checkpoint in one store: the held bytes are the two plans' sums.
  threads::launch(2, [](threads& c) {
    zero::activation_store<threads> store(c, activation_mode::partitioned);
    const auto a = activation<float>(0, 0, 10), b = activation<float>(0, 1, 7);
    store.save(0, a.data(), a.size());
    store.save(1, b.data(), b.size());
    const auto pa = zero::plan_activations(1, 10, 4, 2, activation_mode::partitioned);
    const auto pb = zero::plan_activations(1, 7, 4, 2, activation_mode::partitioned);
    CHECK(store.memory().saved == pa.saved_bytes + pb.saved_bytes);  // 5 + 4 elements
    CHECK(store.memory().saved == 36);
    CHECK(same_bits(store.restore<float>(1), b));
    CHECK(same_bits(store.restore<float>(0), a));
    CHECK(store.memory().restored == pa.restore_bytes + pb.restore_bytes);  // 10 + 8 elements, padded
    CHECK(store.traffic().gather.total_bytes() == pa.gather.total_bytes() + pb.gather.total_bytes());
    CHECK(store.layers_held() == 2);
    store.clear();
    CHECK(store.layers_held() == 0);
    CHECK(store.memory().saved == 0);
    CHECK(store.memory().restored == 0);
  });
}

TEST_CASE("activation_store: misuse is refused naming the rank, the layer and what was expected") {
  threads::launch(2, [](threads& c) {
    zero::activation_store<threads> store(c, activation_mode::partitioned);
    const auto a = activation<float>(0, 0, 8);
    store.save(3, a.data(), a.size());
    const std::string rank = "activation_store rank " + std::to_string(c.rank()) + " (Pa): ";
    auto message = [](auto&& call) -> std::string {
      try {
        call();
      } catch (const zero::error& e) {
        return std::string(e.what()) + " [" + std::to_string(static_cast<int>(e.kind())) + "]";
      }
      return "no error";
    };
    const std::string protocol = " [" + std::to_string(static_cast<int>(zero::error_kind::protocol)) + "]";
    const std::string invalid = " [" + std::to_string(static_cast<int>(zero::error_kind::invalid_argument)) + "]";
    CHECK(message([&] { store.save(3, a.data(), a.size()); }) ==
          rank + "layer 3 is already saved; release it before saving it again" + protocol);
    CHECK(message([&] { (void)store.restore<float>(4); }) ==
          rank + "restore of layer 4, which is not saved (or was released)" + protocol);
    CHECK(message([&] { (void)store.restore<zero::bf16>(3); }) ==
          rank + "restore of layer 3 as bf16: it was saved as fp32" + invalid);
    CHECK(message([&] { store.save(5, a.data(), 0); }) == rank + "layer 5: a checkpoint of 0 elements" + invalid);
    CHECK(message([&] { store.release(9); }) == rank + "release of layer 9, which is not saved" + protocol);
    // Nothing refused changed what is held: layer 3 still comes back whole.
    CHECK(same_bits(store.restore<float>(3), a));
    store.release(3);
    CHECK(message([&] { (void)store.restore<float>(3); }) ==
          rank + "restore of layer 3, which is not saved (or was released)" + protocol);
  });
}

TEST_CASE("activation formulas: the section-6 shape of the ZeRO paper (hidden 8192, batch 32, sequence 1024, MP 16)") {
  // One checkpoint per transformer layer of batch x sequence x hidden fp16 elements: 512 MiB whole.
  const std::uint64_t e = 32ull * 1024 * 8192;
  const auto whole = zero::formula::activation_checkpoint_bytes(1, e, 2, 16, false, false);
  CHECK(whole.system == 536870912ull);
  const auto pa = zero::formula::activation_checkpoint_bytes(1, e, 2, 16, true, false);
  CHECK(pa.system == 536870912ull / 16);
  const auto pa_cpu = zero::formula::activation_checkpoint_bytes(1, e, 2, 16, true, true);
  CHECK(pa_cpu.system == 0);
  CHECK(pa_cpu.host == pa.system);
  const auto p = zero::plan_activations(125, e, 2, 16, activation_mode::partitioned);
  CHECK(p.saved_bytes == 125 * 536870912ull / 16);
  CHECK(p.gather.total_bytes() == 125 * 15 * 536870912ull / 16);  // 15/16 of each checkpoint per backward pass
  CHECK_THROWS_AS(zero::formula::activation_checkpoint_bytes(1, e, 2, 16, false, true), zero::error);
}

TEST_CASE("activation_store: ranks of a group restoring different layers fail together, naming the layers") {
  std::vector<std::string> what(2);
  threads::launch(2, [&](threads& c) {
    zero::activation_store<threads> store(c, activation_mode::partitioned);
    const auto a = activation<float>(0, 0, 8);
    store.save(0, a.data(), a.size());
    store.save(1, a.data(), a.size());
    try {
      (void)store.restore<float>(static_cast<std::size_t>(c.rank()));  // rank 0 layer 0, rank 1 layer 1
    } catch (const zero::error& e) {
      CHECK(e.kind() == zero::error_kind::comm);
      what[static_cast<std::size_t>(c.rank())] = e.what();
    }
    CHECK(store.memory().restored == 0);  // nothing half restored is held
  });
  for (const std::string& w : what) {
    CAPTURE(w);
    CHECK(w.find("layer 0") != std::string::npos);
    CHECK(w.find("layer 1") != std::string::npos);
  }
}
