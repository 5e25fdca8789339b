"""The torch reference: SDAR model (docs/spec.md §1) and the torch twin of the noise. Needs the `export` extra
(torch)."""
