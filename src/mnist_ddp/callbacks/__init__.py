"""The task's own callbacks (``conf/task``'s ``callbacks``): the input batch and the misclassified images,
with their figures."""
