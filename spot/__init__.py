"""spot: SPOT speculative decoding for SDAR block-diffusion language models on ONNX Runtime / TensorRT."""

__version__ = "0.1.0"
