"""The task's data: image DataModules over the engine's base (:mod:`.base`), the IDX file format
(:mod:`.idx`, :mod:`.datamodule`), a folder of images (:mod:`.folder`), and the inputs of a prediction
(:mod:`.inputs`)."""
