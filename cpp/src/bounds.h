// Bounds of the numbers the host reads from manifest.json and drafter.json, checked when a file is read and before
// anything is sized by them ("num_hidden_layers": 1000000000 made both hosts allocate without end). The same as the
// Python runtime's (spot/config.py MAX_*, spot/folder/manifest.py, spot/runtime/drafter.py, spot/descriptors.py;
// tests/test_fuzz_formats.py compares them); docs/exported-folder.md lists them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spot {

constexpr int64_t kMaxVocab = int64_t(1) << 24;           // config.MAX_VOCAB
constexpr int64_t kMaxHidden = int64_t(1) << 16;          // config.MAX_HIDDEN
constexpr int64_t kMaxIntermediate = int64_t(1) << 18;    // config.MAX_INTERMEDIATE
constexpr int64_t kMaxLayers = 1024;                      // config.MAX_LAYERS
constexpr int64_t kMaxHeads = 1024;                       // config.MAX_HEADS
constexpr int64_t kMaxHeadDim = 1024;                     // config.MAX_HEAD_DIM
constexpr int64_t kMaxPositions = int64_t(1) << 24;       // config.MAX_POSITIONS
constexpr int64_t kMaxBlockSize = 256;                    // config.MAX_BLOCK_SIZE
constexpr int64_t kMaxStopIds = 1024;                     // config.MAX_STOP_IDS
constexpr int64_t kMaxNodes = 4096;                       // manifest.MAX_NODES (spot-export's --max-nodes)
constexpr int64_t kMaxFileBytes = INT64_MAX;              // manifest.MAX_FILE_BYTES
constexpr int64_t kMaxDims = 8;                           // manifest.MAX_DIMS (a TensorRT profile's shapes)
constexpr int64_t kMaxDrafterBlock = 64;                  // drafter.MAX_BLOCK
constexpr int64_t kMaxStaleness = 32;                     // drafter.MAX_STALENESS
constexpr int64_t kMaxTreeShapes = 32;                    // drafter.MAX_TREE_SHAPES
constexpr double kMaxStaleTopBonus = 100.0;               // drafter.MAX_STALE_TOP_BONUS
constexpr size_t kMaxJsonDepth = 256;                     // descriptors.MAX_JSON_DEPTH

}  // namespace spot
