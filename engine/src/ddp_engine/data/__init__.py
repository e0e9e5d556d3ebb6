"""Data under DDP for any samples: the DataModule base (:mod:`.sharded`), its resumable sharding across
processes (:mod:`.sharding`), and the check that a DataModule keeps both (:mod:`.conformance`)."""
