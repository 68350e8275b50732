// checkpoint::export_safetensors: the fp32 master weights of a checkpoint as one .safetensors file, one tensor in memory at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/printable.hpp"
#include "zero/checkpoint/safetensors.hpp"
#include "zero/checkpoint/shared_manifest.hpp"
#include "zero/checkpoint/versions.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

struct export_options {
  bool overwrite = true;  // replace an existing output file (atomically); false refuses it, atomically too
  // Called after each tensor is written with its name and the bytes staged for it: the one buffer
  // of the export that grows with the model, so a caller (or a test) can watch the peak.
  std::function<void(const std::string& name, std::size_t staged_bytes)> on_tensor;
};

struct export_result {
  fs::path version_dir;     // the checkpoint version exported
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;  // of the output file
  std::uint64_t step = 0;
  std::uint64_t data_xxh64 = 0;
};

// Writes the master weights of the checkpoint `dir` names to `out` in the safetensors format:
// tensors "unit.tensor" in declaration order, dtype F32, the model's shapes; metadata "format": "pt",
// the step, and the checksum of the data buffer. Every data file's checksum is verified first.
// Streams: one tensor is staged at a time, so the peak memory is one tensor, not the model; since
// every byte of the data files holds one value (see parse_manifest), the output is never larger
// than the checkpoint's data. The output appears atomically: written under an unpredictable
// temporary name created with O_EXCL (nothing planted there is written through), synced, renamed.
inline export_result export_safetensors(const fs::path& dir, const fs::path& out, const export_options& options = {}) {
  const fs::path vdir = resolve(dir);
  const fs::path mp = vdir / manifest_name;
  const auto shared = read_manifest_shared(mp);
  const manifest& m = *shared;
  std::error_code ec;
  ZERO_CHECK(options.overwrite || !fs::exists(fs::symlink_status(out, ec)), io, "export: '", out.string(),
             "' exists (not overwriting it)");

  // Every file verified (sizes, then checksums) before the output is created; opened again, as
  // needed, while streaming.
  detail::data_files files(vdir, m.files);
  files.verify_all();

  std::vector<safetensors::planned_tensor> planned;
  for (const auto& u : m.units)
    for (const auto& t : u.tensors)
      planned.push_back({u.name + "." + t.name, std::vector<std::uint64_t>(t.shape.begin(), t.shape.end())});
  std::string head = safetensors::make_header(
      planned, {{"format", "pt"},
                {"zero.format_version", std::to_string(m.version)},
                {"zero.step", std::to_string(m.state.step)},
                {"zero.optimizer", m.optimizer},
                {std::string(safetensors::data_checksum_key), std::string(16, '0')}});
  const auto hex_at = locate_hex_member(head, safetensors::data_checksum_key);
  ZERO_CHECK(hex_at.has_value(), invalid_argument, "export: no unique ", safetensors::data_checksum_key, " in the header");

  durable_writer w(out, options.overwrite ? existing_file::replace : existing_file::refuse);
  const std::uint64_t n = head.size();
  w.write_unhashed(&n, 8);  // little-endian on this host
  w.write_unhashed(head.data(), head.size());
  std::vector<float> staged;
  std::size_t i = 0;
  for (const auto& u : m.units)
    for (const auto& t : u.tensors) {
      try {
        staged.assign(static_cast<std::size_t>(t.numel), 0.0f);
      } catch (const std::bad_alloc&) {
        fail(error_kind::io, "export: out of memory staging tensor ", quote_name(u.name + "." + t.name), " (",
             t.numel * sizeof(float), " bytes)");
      }
      if (t.parts == 1) {
        for (const auto& s : t.segments)
          files.get(s.file).pread_exact(staged.data() + s.begin,
                                        static_cast<std::size_t>(s.end - s.begin) * sizeof(float), s.offsets[0]);
      } else {
        // Saved by a tensor-parallel mesh in pieces: each read into its place in the whole tensor,
        // run by run (a piece's runs of consecutive whole-tensor elements, runs_of).
        for (const auto& s : t.segments) {
          const piece_runs runs = runs_of(t.piece_spec(static_cast<int>(s.piece)));
          std::uint64_t offset = s.offsets[0];
          for (std::size_t i = static_cast<std::size_t>(s.begin); i < s.end;) {
            const std::size_t within = i % runs.block, n = std::min<std::size_t>(runs.block - within, s.end - i);
            files.get(s.file).pread_exact(staged.data() + i / runs.block * runs.stride + runs.first + within,
                                          n * sizeof(float), offset);
            offset += n * sizeof(float);
            i += n;
          }
        }
      }
      w.write(staged.data(), staged.size() * sizeof(float));
      if (options.on_tensor) options.on_tensor(planned[i].name, staged.capacity() * sizeof(float));
      ++i;
      // Give the buffer back: the next tensor may be smaller, and the peak must stay one tensor.
      std::vector<float>().swap(staged);
    }
  const std::uint64_t data_hash = w.checksum();
  const std::string hex = to_hex(data_hash);
  w.overwrite(hex.data(), 16, 8 + *hex_at);
  const std::uint64_t total = w.bytes();
  w.commit();
  return export_result{vdir, planned.size(), total, m.state.step, data_hash};
}

}  // namespace zero::checkpoint
