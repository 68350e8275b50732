// Safetensors export streams: measured with a counting allocator, its peak memory is one tensor, not the model.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "checkpoint_helpers.hpp"

namespace {

// Bytes allocated through operator new while `tracking` is on and not yet freed, and their peak.
std::atomic<bool> tracking{false};
std::atomic<long long> live{0}, peak{0};

// Each block carries its size and whether it was counted, so frees of older blocks are ignored.
constexpr std::size_t header = 16;

void* counted_alloc(std::size_t n) {
  auto* p = static_cast<unsigned char*>(std::malloc(n + header));
  if (!p) throw std::bad_alloc();
  const bool counted = tracking.load(std::memory_order_relaxed);
  reinterpret_cast<std::size_t*>(p)[0] = n;
  reinterpret_cast<std::size_t*>(p)[1] = counted ? 1 : 0;
  if (counted) {
    const long long now = live += static_cast<long long>(n);
    long long seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  return p + header;
}
void counted_free(void* q) noexcept {
  if (!q) return;
  auto* p = static_cast<unsigned char*>(q) - header;
  if (reinterpret_cast<std::size_t*>(p)[1]) live -= static_cast<long long>(reinterpret_cast<std::size_t*>(p)[0]);
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

using namespace ckpt_test;

TEST_CASE("exporting a model of eight 1 MiB tensors stages one tensor at a time") {
  zero::model_spec spec;
  for (const char* name : {"l0", "l1", "l2", "l3"}) spec.unit(name).tensor("w", {512, 512}).tensor("u", {256, 1024});
  const std::size_t tensor_bytes = 512 * 512 * sizeof(float);
  temp_dir d("export");
  std::vector<float> full;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, spec);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>(i % 1000);
    });
    for (std::size_t u = 0; u < spec.num_units(); ++u) (void)e.gather(zero::unit_id{u});
    for (std::size_t u = spec.num_units(); u-- > 0;) {
      auto p = e.gather(zero::unit_id{u});
      auto g = e.grads(zero::unit_id{u});
      const auto gv = g.view();
      for (std::size_t j = 0; j < gv.size(); ++j) gv.data()[j] = 0.01f * static_cast<float>(j % 17) - 0.08f;
      e.reduce(zero::unit_id{u});
    }
    e.step();
    ckpt::save(e, comm, d / "ckpt");
    auto p = e.full_params();
    if (comm.rank() == 0) full = std::move(p);
  });

  const fs::path out = d / "model.safetensors";
  std::size_t largest_staged = 0;
  ckpt::export_options o;
  o.on_tensor = [&](const std::string&, std::size_t bytes) { largest_staged = std::max(largest_staged, bytes); };
  live = 0;
  peak = 0;
  tracking = true;
  const auto r = ckpt::export_safetensors(d / "ckpt", out, o);
  tracking = false;

  const long long model_bytes = static_cast<long long>(spec.numel() * sizeof(float));
  MESSAGE("export peak ", peak.load(), " bytes for a model of ", model_bytes, " bytes (", r.bytes, " written)");
  CHECK(largest_staged == tensor_bytes);
  CHECK(peak.load() >= static_cast<long long>(tensor_bytes));  // one tensor is staged...
  // ...and besides it only the 1 MiB read buffer of the checksum pass and small bookkeeping.
  CHECK(peak.load() < static_cast<long long>(tensor_bytes + (std::size_t{1} << 20) + (256u << 10)));
  CHECK(peak.load() * 3 < model_bytes);

  const auto h = ckpt::safetensors::read_header(out);
  CHECK(ckpt::safetensors::verify_data(out, h));
  std::vector<float> all;
  for (const auto& t : h.tensors) {
    const auto v = ckpt::safetensors::read_f32(out, h, t);
    all.insert(all.end(), v.begin(), v.end());
  }
  CHECK(bit_equal(all, full));
}

TEST_CASE("parsing a hostile manifest allocates at most 16 bytes per byte of text, whatever its shape") {
  const std::size_t n = std::size_t{4} << 20;
  auto repeated = [&](const std::string& open, const std::string& item, const std::string& close) {
    std::string s = open;
    while (s.size() < n) s += item + ",";
    return s + item + close;
  };
  std::string keys = "{";
  for (int i = 0; keys.size() < n; ++i) keys += "\"k" + std::to_string(i) + "\":0,";
  keys += "\"x\":0}";
  const std::pair<const char*, std::string> shapes[] = {
      {"empty arrays", repeated("[", "[]", "]")},
      {"zeros", repeated("[", "0", "]")},
      {"empty strings", repeated("[", "\"\"", "]")},
      {"empty objects", repeated("[", "{}", "]")},
      {"short strings", repeated("[", "\"abcdefghijklmnopq\"", "]")},
      {"many members", keys},
      {"unterminated string", "{\"format\": \"" + std::string(n, 'a')},
      {"deep nesting", std::string(n / 2, '[') + std::string(n / 2, ']')},
  };
  for (const auto& [label, text] : shapes) {
    const std::string name = label;
    CAPTURE(name);
    live = 0;
    peak = 0;
    tracking = true;
    try {
      (void)ckpt::parse_manifest(text, "hostile", false);
    } catch (const zero::error&) {
    }
    tracking = false;
    MESSAGE(name, ": peak ", static_cast<double>(peak.load()) / static_cast<double>(text.size()),
            " bytes per byte of text");
    CHECK(peak.load() <= static_cast<long long>(16 * text.size() + (std::size_t{1} << 20)));
  }
}

TEST_CASE("save and load stage 4 MiB chunks of each array, whatever the unit's size: states on disk stay there") {
  // One unit of 3 Mi elements: 36 MiB of master weights (fp32: the parameters) and AdamW's two slots.
  zero::model_spec spec;
  spec.unit("big").tensor("w", {3072, 1024});
  const std::size_t unit_elements = 3072 * 1024, chunk_bytes = std::size_t{4} << 20;
  temp_dir d("chunks");
  zero::engine_options on_disk;
  on_disk.offload.tier = zero::offload_tier::disk;
  on_disk.offload.directory = d.path.string();
  long long save_peak = 0, load_peak = 0;
  std::vector<float> saved, loaded;
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage0, zero::comm::threads, adamw> e(comm, spec, {}, on_disk);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>(i % 1000);
    });
    (void)e.gather(zero::unit_id{0});
    {
      auto p = e.gather(zero::unit_id{0});
      auto g = e.grads(zero::unit_id{0});
      const auto gv = g.view();
      for (std::size_t j = 0; j < gv.size(); ++j) gv.data()[j] = 0.01f * static_cast<float>(j % 17) - 0.08f;
      e.reduce(zero::unit_id{0});
    }
    e.step();
    live = 0;
    peak = 0;
    tracking = true;
    ckpt::save(e, comm, d / "ckpt");
    tracking = false;
    save_peak = peak.load();
    saved = e.full_params();
    zero::engine<zero::stage0, zero::comm::threads, adamw> f(comm, spec, {}, {});
    live = 0;
    peak = 0;
    tracking = true;
    ckpt::load(f, comm, d / "ckpt");
    tracking = false;
    load_peak = peak.load();
    loaded = f.full_params();
  });
  const long long state_bytes = static_cast<long long>(3 * unit_elements * sizeof(float));
  MESSAGE("save peak ", save_peak, " bytes, load peak ", load_peak, " bytes, for ", state_bytes, " bytes of states");
  // Save: one array's chunk, the checksum writer's buffer and bookkeeping; load: one chunk of each array.
  CHECK(save_peak < static_cast<long long>(chunk_bytes + (std::size_t{1} << 20) + (256u << 10)));
  CHECK(load_peak < static_cast<long long>(3 * chunk_bytes + (std::size_t{1} << 20) + (256u << 10)));
  CHECK(load_peak * 2 < state_bytes);
  CHECK(saved == loaded);
}
