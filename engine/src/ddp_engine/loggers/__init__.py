"""The experiment trackers of a run (``ddp_engine/conf/logger``): TensorBoard (the default), CSV, MLflow and
Weights & Biases, each under its own key, several at once; built, continued across a resume in
place, and written to through each one's own API."""
