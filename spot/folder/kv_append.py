"""The KV-append graph's contract (spot.export.kv_append_graph builds it): a stored block's K/V appended to one layer's
cache on the device the target runs on.

  inputs   past_k, past_v [Hkv,C,D]     one layer's cache (model dtype; C may be 0)
           new_k, new_v [Hkv,S,D]       that layer's slice of the target's new_k / new_v [L,1,Hkv,S,D] of one state
                                        (N = 1: prefill, store), bound in place at the layer's offset (no copy)
  outputs  k, v [Hkv,C+S,D]             Concat(past, new) along the sequence axis
"""
KV_APPEND_FILE = "kv_append.onnx"
INPUTS = ("past_k", "past_v", "new_k", "new_v")
OUTPUTS = ("k", "v")
