"""The exported folder's contract: what spot-export writes and every host reads (manifest, graph names and I/O, the
sampling epilogue's and kv_append's interfaces). The engines and the runtime import this, never spot.export."""
