"""The image machinery's config groups (YAML only), on Hydra's search path after the engine's."""
