// offload_options: where an engine keeps its master weights and optimizer slots (system memory, host memory, a disk).
#pragma once

#include <cstddef>
#include <string>

namespace zero {

// Where the master weights (when kept apart from the parameters) and the optimizer slots live.
enum class offload_tier {
  none,  // the system's own memory, with the parameters and gradients (the default)
  host,  // host memory (pinned where the system is a device), updated there by the host loops
  disk,  // a file per rank on a local disk, streamed through host memory slice by slice
};

// engine_options::offload. The parameters and gradients stay in the system's memory: what the
// compute needs. The step streams the offloaded arrays in slices of slice_elements (the disk tier
// reads slice k + 1 and writes slice k - 1 back while slice k is updated), so the host memory it
// stages is a few slices whatever the model's size (docs/offload.md).
struct offload_options {
  offload_tier tier = offload_tier::none;
  std::string directory;  // disk: an existing directory on a local file system, where each rank creates its file
  // Elements per slice: a multiple of 1024 (4 KiB of fp32, the alignment of direct I/O), > 0.
  std::size_t slice_elements = std::size_t{1} << 20;
  // disk: open with O_DIRECT (no page cache) where the file system allows it, else buffered I/O.
  bool direct_io = true;
};

}  // namespace zero
