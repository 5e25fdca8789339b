"""The application layer: what the commands run on top of the runtime, the engines and the exporter — the
bench, the demo, --model resolution, the tuned budgets, requests as users give them, plots."""
