"""Export SDAR checkpoints to ONNX folders the runtime opens by their manifest (see docs/exported-folder.md)."""
