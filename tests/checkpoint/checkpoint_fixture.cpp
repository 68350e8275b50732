// checkpoint_fixture OUTDIR: writes a checkpoint, its safetensors export and the expected values as raw
// files, for the independent Python readers and the fuzz corpus.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "../tp_model.hpp"
#include "checkpoint_helpers.hpp"
#include "zero/comm/mesh.hpp"

namespace {

void write_raw(const ckpt_test::fs::path& p, const std::vector<float>& v) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!f) throw zero::error(zero::error_kind::io, "cannot write " + p.string());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: checkpoint_fixture OUTDIR\n";
    return 2;
  }
  namespace fs = ckpt_test::fs;
  namespace ckpt = zero::checkpoint;
  try {
    const fs::path out = argv[1];
    fs::create_directories(out);
    // The toy model after 3 steps at N = 4 in stage 3, saved; then exported.
    const auto s = ckpt_test::train<zero::stage3>(4, 3, out / "ckpt");
    ckpt::export_safetensors(out / "ckpt", out / "model.safetensors");
    write_raw(out / "expected_master.f32", s.master);
    write_raw(out / "expected_m.f32", s.slots[0]);
    write_raw(out / "expected_v.f32", s.slots[1]);
    ckpt::json tensors = ckpt::json::array();
    const zero::model_spec spec = toy::spec();
    for (const auto& u : spec.units())
      for (const auto& t : u.tensors) tensors.push_back({{"name", u.name + "." + t.name}, {"shape", t.shape}});
    std::ofstream(out / "expected.json") << ckpt::json{{"tensors", tensors},
                                                       {"step", s.state.step},
                                                       {"world_size", 4},
                                                       {"stage", 3},
                                                       {"slots", {"master", "m", "v"}}}
                                                .dump(1)
                                         << "\n";
    // A checkpoint of a 2 x 2 tensor-parallel mesh (split tensors stored in pieces), and the whole
    // model's expected values from the same training at tp = 1 (which gives the same bits).
    const zero::model_spec whole = tp_model::model();
    ckpt_test::state_arrays w = ckpt_test::sized_arrays<ckpt_test::adamw>(whole);
    for (const int tp : {2, 1})
      zero::comm::threads::launch(2 * tp, [&](zero::comm::threads& c) {
        zero::comm::mesh<zero::comm::threads> m(c, {2, tp});
        zero::engine<zero::stage2, zero::comm::threads, ckpt_test::adamw> e(m, whole);
        e.initialize(zero::from_whole_tensors(tp_model::whole_init()));
        for (std::uint64_t t = 0; t < 3; ++t) tp_model::mesh_step(e, m.coordinates().dp, t);
        if (tp == 2) ckpt::save(e, m.world(), out / "mesh_ckpt");
        if (tp == 1) ckpt_test::read_state(e, w);
      });
    write_raw(out / "expected_mesh_master.f32", w.master);
    write_raw(out / "expected_mesh_m.f32", w.slots[0]);
    write_raw(out / "expected_mesh_v.f32", w.slots[1]);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "checkpoint_fixture: " << e.what() << "\n";
    return 1;
  }
}
