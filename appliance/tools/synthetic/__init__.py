"""Synthetic chest CT: deterministic phantom slices and series with ground truth, as real DICOM.

The project cannot download patient data or public datasets, so it generates its own. One generator feeds
model training, the tests and ``appliance bench``:

* :func:`generate_slice` (:mod:`.series`; the drawing is in :mod:`.phantom`) draws one axial chest slice in
  Hounsfield units: air, a body outline with a fat layer, ribs, spine, heart and aorta, two lungs at about
  -850 HU with a dependent density gradient and texture, pulmonary vessels (round cross-sections up to 3 mm
  and elongated branches, some wider near the hilum) as distractors, and 0-3 nodules of 4-30 mm (solid or
  sub-solid, slightly lobulated). A blur models the scanner's point spread and correlated Gaussian noise
  models quantum noise. The field of view (300-450 mm), matrix size (512 typical, sometimes
  256/384/640/768), dose and contrast vary.
* :func:`generate_series` draws a coherent stack: one anatomy, nodules as spheres cut by each slice.
* :func:`to_dicom` (:mod:`.files`) writes a CT Image Storage Part-10 file in any of
  :data:`TRANSFER_SYNTAXES`.
* :func:`model_input` applies exactly what the serving pipeline applies (stored values -> modality LUT ->
  model window -> area resize), so training sees bit-for-bit what serving sees.
* :func:`workload` produces named mixes of DICOM bytes for benchmarks.

Everything is a pure function of the seed. Patients are phantoms (``PHANTOM^0001``); nothing here is, or is
derived from, patient data.
"""

from appliance.tools.synthetic.files import TRANSFER_SYNTAXES, WORKLOADS, read_back, to_dicom, workload
from appliance.tools.synthetic.series import (
    NODULE_MIN_DIAMETER_MM,
    SeriesInfo,
    SliceTruth,
    generate_series,
    generate_slice,
    modality_values,
    model_input,
    stored_values,
)

__all__ = [
    "NODULE_MIN_DIAMETER_MM",
    "TRANSFER_SYNTAXES",
    "WORKLOADS",
    "SeriesInfo",
    "SliceTruth",
    "generate_series",
    "generate_slice",
    "model_input",
    "modality_values",
    "read_back",
    "stored_values",
    "to_dicom",
    "workload",
]
