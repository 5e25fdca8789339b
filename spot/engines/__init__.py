"""Backends that implement `spot.runtime.engine.Engine`: torch reference, ONNX Runtime, TensorRT."""
