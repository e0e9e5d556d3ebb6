"""Data under DDP for any samples: the DataModule base (:mod:`.sharded`), its resumable sharding across
processes (:mod:`.sharding`), the check that a DataModule keeps both (:mod:`.conformance`), and
how its loaders' worker processes start (:mod:`.loader_workers`, :mod:`.loader_forkserver`)."""
