"""The drafter pair on disk: drafter.onnx beside its descriptor drafter.json (format spot-drafter). Named here, below
the runtime that loads the pair (spot.runtime.drafter), so that the exported folder's contract (spot.folder) and the
proofs of what spot wrote (spot.owned) name its files without importing the runtime."""
DRAFTER_ONNX = "drafter.onnx"
DRAFTER_JSON = "drafter.json"
FORMAT = "spot-drafter"
FORMAT_VERSION = 1
