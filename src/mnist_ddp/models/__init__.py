"""The models: networks (:mod:`.networks`) and the LightningModule that trains them (:mod:`.classifier`)."""
