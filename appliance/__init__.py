"""edge-appliance: a hospital-local DICOM inference runtime.

The data path (see ``appliance/serving/app.py``)::

    gRPC server -> dicom (parse, validate, decode) -> preprocess (into a batch slot)
                -> batcher (fixed B, padding, priorities, deadlines, thermal pacing)
                -> engine (one owner thread) -> postprocess -> reply
"""

__version__ = "0.1.0"
