"""The data: the IDX file format (:mod:`.idx`), the DataModule (:mod:`.datamodule`) and its
resumable sharding across DDP processes (:mod:`.sharding`); the inputs of a prediction (:mod:`.inputs`)."""
