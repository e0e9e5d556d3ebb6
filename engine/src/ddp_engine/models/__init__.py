"""Building the task's LightningModule for its data (:mod:`.build`) and its optimizer and learning-rate
schedule (:mod:`.optimization`)."""
