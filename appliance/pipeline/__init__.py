"""Model input and output.

The preprocessing steps and pipelines that write a frame into its batch slot
(:mod:`.preprocess`), and the postprocessing that turns engine outputs into findings (:mod:`.postprocess`).
"""
