"""ONNX Runtime, imported with one clear error for every place that runs a graph (target, drafter, epilogue,
kv_append, validation): an onnxruntime built for numpy 1.x beside numpy 2 fails inside its import, which was
reported as "not installed" or as a raw traceback depending on where it was first imported."""
from __future__ import annotations

from spot.errors import SpotError


def load_onnxruntime():
    """The onnxruntime module; SpotError saying whether it is missing or installed but unimportable."""
    try:
        # onnxruntime: loaded here once, with its own error
        import onnxruntime
    except ModuleNotFoundError as e:
        if e.name != "onnxruntime":
            raise SpotError(f"onnxruntime is installed but could not be imported: {e}",
                            "reinstall onnxruntime (>= 1.19 with numpy 2)") from None
        raise SpotError("decoding needs onnxruntime, which is not installed", "pip install onnxruntime") from None
    except (ImportError, AttributeError) as e:   # e.g. a build for numpy 1.x beside numpy 2 (_ARRAY_API not found)
        raise SpotError(f"onnxruntime is installed but could not be imported: {e}",
                        "install onnxruntime >= 1.19 (the first built for numpy 2), or numpy < 2") from None
    return onnxruntime
