"""Lightning callbacks of a run (``conf/callbacks``): TensorBoard summaries, throughput, misclassified
images and their figures, the DDP settings report, and stopping on signals."""
