"""The cost model (pure Python, no torch): the time and memory of a configuration on a cluster,
layer by layer, with the collectives and the pipeline schedule it implies."""
