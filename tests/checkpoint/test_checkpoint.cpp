// Checkpoints: a save at one world size and stage loads bit-identically at any other, resumes exactly,
// records what it should, keeps versions as configured, and exports to safetensors.
#include <doctest/doctest.h>

#include <fstream>
#include <type_traits>

#include "checkpoint_helpers.hpp"

using namespace ckpt_test;

namespace {

// The toy model trained 6 steps at N = 4 in stage 3 and saved: the reference of most cases below.
struct saved_at_4 {
  temp_dir dir{"ckpt"};
  state_arrays state;
  saved_at_4() { state = train<zero::stage3>(4, 6, dir.path); }
};

template <class Stage>
std::vector<float> resume_and_train(int n, const fs::path& dir, int first_step, int steps) {
  std::vector<float> out;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, adamw> e(comm, toy::spec());
    const auto r = ckpt::load(e, comm, dir);
    CHECK(e.steps() == r.info.state.step);
    for (int t = first_step; t < first_step + steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("a stage-3 save at N = 4 loads at N = 1, 2, 3, 8 bit-identically", Stage, zero::stage0, zero::stage1,
                   zero::stage2, zero::stage3) {
  const saved_at_4 saved;
  CHECK(saved.state.state.step == 6);
  for (int n : {1, 2, 3, 8}) {
    CAPTURE(n);
    const state_arrays loaded = load_state<Stage>(n, saved.dir.path);
    CHECK(bit_equal(loaded.master, saved.state.master));
    CHECK(bit_equal(loaded.slots[0], saved.state.slots[0]));
    CHECK(bit_equal(loaded.slots[1], saved.state.slots[1]));
    CHECK(loaded.state.step == 6);
  }
}

TEST_CASE("saves at other world sizes and stages load anywhere too") {
  temp_dir a("ckpt"), b("ckpt");
  const auto s1 = train<zero::stage0>(3, 4, a.path);
  const auto s2 = train<zero::stage1>(8, 4, b.path);
  CHECK(bit_equal(load_state<zero::stage3>(5, a.path), s1));
  CHECK(bit_equal(load_state<zero::stage2>(1, b.path), s2));
  CHECK(bit_equal(load_state<zero::stage0>(2, b.path), s2));
}

TEST_CASE("an SGD checkpoint keeps its single slot and its hyper-parameters") {
  temp_dir d("ckpt");
  const zero::optim::sgd opt{.lr = 0.05f, .momentum = 0.8f, .weight_decay = 1e-4f, .nesterov = true};
  const auto saved = train<zero::stage2, zero::optim::sgd>(3, 5, d.path, opt);
  CHECK(bit_equal(load_state<zero::stage1, zero::optim::sgd>(2, d.path, opt), saved));
  const auto m = ckpt::read_manifest(d.path);
  CHECK(m.optimizer == "sgd");
  CHECK(m.slots == std::vector<std::string>{"master", "momentum"});
  const auto back = ckpt::optimizer_from<zero::optim::sgd>(m);
  CHECK(back.lr == opt.lr);
  CHECK(back.momentum == opt.momentum);
  CHECK(back.weight_decay == opt.weight_decay);
  CHECK(back.nesterov == opt.nesterov);
  CHECK_THROWS_AS(ckpt::optimizer_from<adamw>(m), zero::error);
}

// Every optimizer of the library: its slots saved under their names, resharded from N = 3 (stage 2) to
// N = 2 (stage 1) bit for bit, and every hyper-parameter read back as saved.
TEST_CASE_TEMPLATE_DEFINE("a checkpoint of each optimizer names its slots, reshards and keeps its settings", Opt,
                          checkpoint_per_optimizer) {
  CAPTURE(Opt::name);
  temp_dir d("ckpt");
  // Settings other than the defaults, so reading back the defaults would fail: each float scaled,
  // each bool flipped (where a flip is valid for the optimizer).
  Opt opt{};
  zero::for_each_hyper_parameter(Opt::hyper_parameters(), [&](const auto& h) {
    using T = typename std::remove_cvref_t<decltype(h)>::type;
    if constexpr (std::is_same_v<T, bool>) {
      Opt flipped = opt;
      flipped.*(h.member) = !(opt.*(h.member));
      try {
        zero::validate_optimizer(flipped);
        opt = flipped;
      } catch (const zero::error&) {
      }
    } else {
      opt.*(h.member) = opt.*(h.member) == T(0) ? T(0.001) : opt.*(h.member) * T(0.75);
    }
  });
  const auto saved = train<zero::stage2, Opt>(3, 4, d.path, opt);
  CHECK(bit_equal(load_state<zero::stage1, Opt>(2, d.path, opt), saved));
  const auto m = ckpt::read_manifest(d.path);
  CHECK(m.optimizer == Opt::name);
  std::vector<std::string> names{"master"};
  for (auto n : Opt::slot_names) names.emplace_back(n);
  CHECK(m.slots == names);
  const Opt back = ckpt::optimizer_from<Opt>(m);
  zero::for_each_hyper_parameter(Opt::hyper_parameters(), [&](const auto& h) {
    CAPTURE(h.name);
    CHECK(back.*(h.member) == opt.*(h.member));
  });
}
TEST_CASE_TEMPLATE_APPLY(checkpoint_per_optimizer, zero::optimizers::tuple);

TEST_CASE_TEMPLATE("resuming at the same N continues bit-identically to a run that never stopped", Stage, zero::stage0,
                   zero::stage1, zero::stage2, zero::stage3) {
  temp_dir d("ckpt");
  (void)train<zero::stage3>(4, 5, d.path);
  const auto uninterrupted = toy::run<zero::stage3>(4, 10, adamw{}).params;
  CHECK(bit_equal(resume_and_train<Stage>(4, d.path, 5, 5), uninterrupted));
}

TEST_CASE("resuming at another N continues from the identical state") {
  temp_dir d("ckpt");
  const auto saved = train<zero::stage3>(4, 5, d.path);
  // The same continuation from the saved arrays handed over through the state API directly.
  std::vector<float> direct;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage1, zero::comm::threads, adamw> e(comm, toy::spec());
    const auto base = toy::unit_bases(e.spec());
    for (std::size_t u = 0; u < e.spec().num_units(); ++u) {
      const auto r = e.held_range(zero::unit_id{u});
      const float* slots[2] = {saved.slots[0].data() + base[u] + r.begin, saved.slots[1].data() + base[u] + r.begin};
      e.write_state(zero::unit_id{u}, r, saved.master.data() + base[u] + r.begin, slots);
    }
    e.finish_load(saved.state);
    for (int t = 5; t < 9; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto p = e.full_params();
    if (comm.rank() == 0) direct = std::move(p);
  });
  CHECK(bit_equal(resume_and_train<zero::stage1>(2, d.path, 5, 4), direct));
}

TEST_CASE("the manifest records the model, policies, optimizer, state, world size, stage and checksums") {
  const saved_at_4 saved;
  const auto m = ckpt::read_manifest(saved.dir.path);
  CHECK(m.version == ckpt::format_version);
  CHECK(m.world_size == 4);
  CHECK(m.stage == 3);
  CHECK(m.precision == "fp32");
  CHECK(m.optimizer == "adamw");
  CHECK(m.slots == std::vector<std::string>{"master", "m", "v"});
  CHECK(m.state.step == 6);
  CHECK(m.files.size() == 4);
  CHECK(ckpt::spec_of(m) == toy::spec());
  const auto opt = ckpt::optimizer_from<adamw>(m);
  const adamw def{};
  CHECK(opt.lr == def.lr);
  CHECK(opt.beta1 == def.beta1);
  CHECK(opt.beta2 == def.beta2);
  CHECK(opt.eps == def.eps);
  CHECK(opt.weight_decay == def.weight_decay);
  // Each rank's file holds its slice of every slot: 3 slots x 4 bytes x the model's elements in all.
  std::uint64_t total = 0;
  for (const auto& f : m.files) total += f.bytes;
  CHECK(total == toy::spec().numel() * 3 * 4);
  CHECK_NOTHROW(ckpt::verify(saved.dir.path));
}

TEST_CASE("every training_state field survives the manifest") {
  ckpt::manifest m = ckpt::read_manifest(saved_at_4().dir.path);
  m.state = zero::training_state{123456789012345ull, 32768.5f, 77, 3, 9};
  const auto back = ckpt::parse_manifest(ckpt::serialize_manifest(m), "test");
  CHECK(back.state.step == 123456789012345ull);
  CHECK(back.state.loss_scale == 32768.5f);
  CHECK(back.state.clean_steps == 77);
  CHECK(back.state.hysteresis_left == 3);
  CHECK(back.state.skipped_steps == 9);
}

TEST_CASE("saves make numbered versions; older ones are removed beyond keep; load takes the newest") {
  temp_dir d("ckpt");
  const auto spec = toy::spec();
  std::vector<state_arrays> states(4, sized_arrays<adamw>(spec));
  std::vector<std::uint64_t> numbers;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage2, zero::comm::threads, adamw> e(comm, spec);
    e.initialize(toy::initializer());
    for (int i = 0; i < 4; ++i) {
      toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(i));
      ckpt::save_options o;
      o.keep = i < 2 ? 1 : 2;
      const auto r = ckpt::save(e, comm, d.path, o);
      if (comm.rank() == 0) numbers.push_back(r.version);
      read_state(e, states[static_cast<std::size_t>(i)]);
    }
  });
  CHECK(numbers == std::vector<std::uint64_t>{1, 2, 3, 4});
  const auto versions = ckpt::list_versions(d.path);
  REQUIRE(versions.size() == 2);
  CHECK(versions[0].number == 3);
  CHECK(versions[1].number == 4);
  CHECK(bit_equal(load_state<zero::stage3>(3, d.path), states[3]));
  // A version directory can be named directly.
  CHECK(bit_equal(load_state<zero::stage3>(3, versions[0].path), states[2]));
}

TEST_CASE("an incomplete newer version is ignored by load and removed by the next save") {
  temp_dir d("ckpt");
  const auto saved = train<zero::stage3>(2, 3, d.path);
  fs::create_directory(d / ckpt::version_name(7));
  std::ofstream(d / ckpt::version_name(7) / "rank-00000-of-00002.bin") << "partial";
  CHECK(bit_equal(load_state<zero::stage0>(1, d.path), saved));
  const auto again = train<zero::stage3>(2, 4, d.path);
  const auto versions = ckpt::list_versions(d.path);
  REQUIRE(versions.size() == 1);
  CHECK(versions[0].number == 8);
  CHECK(versions[0].committed);
  CHECK(bit_equal(load_state<zero::stage0>(1, d.path), again));
}

TEST_CASE("a failure on one rank fails the save on every rank and keeps the previous checkpoint") {
  temp_dir d("ckpt");
  const auto before = train<zero::stage3>(3, 2, d.path);
  const auto spec = toy::spec();
  std::vector<int> threw(3, 0);
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, spec);
    ckpt::load(e, comm, d.path);
    toy::train_step(e, comm.rank(), e.steps());
    ckpt::save_options o;
    o.on_phase = [](ckpt::save_phase p, int rank) {
      if (p == ckpt::save_phase::data_written && rank == 1) throw zero::error(zero::error_kind::io, "disk full on rank 1");
    };
    try {
      ckpt::save(e, comm, d.path, o);
    } catch (const zero::error& x) {
      threw[static_cast<std::size_t>(comm.rank())] = std::string(x.what()).find("disk full on rank 1") != std::string::npos;
    }
  });
  CHECK(threw == std::vector<int>{1, 1, 1});
  CHECK(bit_equal(load_state<zero::stage3>(2, d.path), before));
}

TEST_CASE("a checkpoint with more data files than a reader keeps open still loads and exports") {
  temp_dir d("ckpt");
  const int n = static_cast<int>(ckpt::detail::data_files::max_open) + 3;
  const auto saved = train<zero::stage3>(n, 1, d.path);
  CHECK(ckpt::read_manifest(d.path).files.size() == static_cast<std::size_t>(n));
  CHECK(bit_equal(load_state<zero::stage0>(1, d.path), saved));
  const auto r = ckpt::export_safetensors(d.path, d / "model.safetensors");
  CHECK(r.tensors == 7);
}

TEST_CASE("misuse is refused with a message that says what to do") {
  temp_dir d("ckpt");
  (void)train<zero::stage3>(2, 1, d.path);
  const auto version = ckpt::list_versions(d.path).at(0).path;
  // Saving into a version directory would hide the new versions behind its manifest.
  CHECK_THROWS_WITH_AS(train<zero::stage3>(2, 1, version), doctest::Contains("one checkpoint version"), zero::error);
  CHECK_THROWS_WITH_AS(load_state<zero::stage3>(2, d / "missing"), doctest::Contains("does not exist"), zero::error);
  temp_dir empty("ckpt");
  CHECK_THROWS_WITH_AS(load_state<zero::stage3>(2, empty.path), doctest::Contains("no committed checkpoint"),
                       zero::error);
  // A communicator that is not the engine's.
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::comm::threads::launch(1, [&](zero::comm::threads& other) {
      zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, toy::spec());
      CHECK_THROWS_WITH_AS(ckpt::load(e, other, d.path), doctest::Contains("not the engine's"), zero::error);
    });
  });
}

TEST_CASE("export writes the master weights as unit.tensor F32 tensors a reader gets back exactly") {
  const saved_at_4 saved;
  const fs::path out = saved.dir / "model.safetensors";
  const auto r = ckpt::export_safetensors(saved.dir.path, out);
  CHECK(r.tensors == 7);
  CHECK(r.step == 6);
  CHECK(r.bytes == fs::file_size(out));
  const auto h = ckpt::safetensors::read_header(out);
  CHECK(h.data_start % 8 == 0);
  CHECK(ckpt::safetensors::verify_data(out, h));
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.metadata.at("zero.step") == "6");
  std::vector<std::string> names;
  std::vector<float> all;
  for (const auto& t : h.tensors) {
    names.push_back(t.name);
    CHECK(t.dtype == "F32");
    const auto v = ckpt::safetensors::read_f32(out, h, t);
    all.insert(all.end(), v.begin(), v.end());
  }
  CHECK(names == std::vector<std::string>{"embed.w", "tiny.scale", "block.w", "block.b", "block.gain", "head.w", "head.b"});
  CHECK(h.tensors[2].shape == std::vector<std::uint64_t>{29, 13});
  CHECK(bit_equal(all, saved.state.master));
  // Not overwriting when asked not to.
  ckpt::export_options keep;
  keep.overwrite = false;
  CHECK_THROWS_AS(ckpt::export_safetensors(saved.dir.path, out, keep), zero::error);
}
