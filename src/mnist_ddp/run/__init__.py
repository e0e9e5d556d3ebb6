"""The task's own commands: predict and export a checkpoint of the image classifier."""
