// zero_export: converts a zero checkpoint directory into one .safetensors file of fp32 master weights.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "tool_cli.hpp"
#include "zero/checkpoint/export.hpp"
#include "zero/checkpoint/load.hpp"
#include "zero/checkpoint/printable.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "Converts a zero checkpoint into a .safetensors file: the fp32 master weights, tensors named unit.tensor.\n"
      "CHECKPOINT is a directory of versions (its newest complete version is read) or one version directory.\n"
      "Every data file's checksum is verified; memory use stays at one tensor however large the model.",
      "zero_export"};
  std::string input, output;
  bool force = false, verify_only = false, json = false;
  app.add_option("checkpoint", input, "checkpoint directory")
      ->required()
      ->check(toolcli::checked([](const std::string& t) { return toolcli::input_problem(t, S_IFDIR); }, "DIR"));
  auto* output_flag = app.add_option("output", output, "the .safetensors file to write (not with --verify)")
                          ->check(toolcli::checked(
                              [](const std::string& t) {
                                return toolcli::output_file_problem(t, "an empty path; give the file to write");
                              },
                              "FILE"));
  auto* force_flag = app.add_flag("-f,--force", force, "replace OUTPUT if it exists")->needs(output_flag);
  app.add_flag("--verify", verify_only, "only check the checkpoint (manifest and every checksum); write nothing")
      ->excludes(output_flag)
      ->excludes(force_flag);
  app.add_flag("--json", json, "print one JSON object describing the result on stdout");
  if (const auto code = toolcli::parse(app, argc, argv)) return *code;
  if (!verify_only && output.empty()) return toolcli::usage_error(app, "OUTPUT is required (or --verify)");

  namespace ckpt = zero::checkpoint;
  try {
    if (verify_only) {
      const auto m = ckpt::verify(input);
      if (json)
        std::cout << ckpt::json{{"checkpoint", input}, {"ok", true}, {"step", m.state.step}, {"files", m.files.size()}}.dump(-1, ' ', false, ckpt::json::error_handler_t::replace)
                  << "\n";
      else
        std::cerr << "zero_export: " << toolcli::quote(input) << ": ok (step " << m.state.step << ", " << m.files.size()
                  << " data files verified)\n";
      return 0;
    }
    ckpt::export_options o;
    o.overwrite = force;
    const auto r = ckpt::export_safetensors(input, output, o);
    if (json)
      std::cout << ckpt::json{{"checkpoint", r.version_dir.string()},
                              {"output", output},
                              {"tensors", r.tensors},
                              {"bytes", r.bytes},
                              {"step", r.step},
                              {"data_xxh64", ckpt::to_hex(r.data_xxh64)}}
                       .dump(-1, ' ', false, ckpt::json::error_handler_t::replace)
                << "\n";
    else
      std::cerr << "zero_export: wrote " << toolcli::quote(output) << " (" << r.tensors << " tensors, " << r.bytes
                << " bytes, step " << r.step << ") from " << toolcli::quote(r.version_dir.string()) << "\n";
    return 0;
  } catch (...) {
    // Every failure, std::bad_alloc included, ends here as one message and exit status 1: an
    // uncaught exception would abort without unwinding, leaving the temporary output behind.
    // Whatever the message quotes from a file is escaped before it reaches the terminal.
    const zero::error e = zero::as_error(std::current_exception());
    std::cerr << "zero_export: error (" << zero::to_string(e.kind())
              << "): " << ckpt::printable(e.what(), 4096, ckpt::printable_mode::message) << "\n";
    return 1;
  }
}
