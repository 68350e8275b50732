// The checkpoint headers in one include: save (blocking or asynchronous), load (any world size and stage), peer
// snapshots in memory, safetensors export. Needs nlohmann/json and xxHash (header-only) besides the core library.
#pragma once

#include "zero/checkpoint/bounded_json.hpp"
#include "zero/checkpoint/checksum.hpp"
#include "zero/checkpoint/export.hpp"
#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/load.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/optimizer_settings.hpp"
#include "zero/checkpoint/peer_snapshot.hpp"
#include "zero/checkpoint/printable.hpp"
#include "zero/checkpoint/safetensors.hpp"
#include "zero/checkpoint/save.hpp"
#include "zero/checkpoint/save_async.hpp"
#include "zero/checkpoint/shared_manifest.hpp"
#include "zero/checkpoint/versions.hpp"
