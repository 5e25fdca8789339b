"""Triton Inference Server for scale-out (`spot triton-repo`, docs/deployment.md).

  repo.py     writes a Triton model repository: config.pbtxt (decoupled, one engine per instance) and model.py
  backend.py  the Python-backend model: the spot runtime on the exported folder, a response per finished block

The repository's model.py only imports spot.triton.backend: the spot installed where tritonserver runs is the one
that decodes (upgrading it upgrades the model, no new repository needed).
"""
