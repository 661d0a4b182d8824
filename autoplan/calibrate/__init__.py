"""Calibration from runs: fit per-GPU-type cost parameters to measured step times.

``autoplan calibrate`` reads run reports and the plans they ran, and writes a catalog overlay
(``autoplan.cluster.catalog.CatalogOverlay``) that ``autoplan solve --catalog`` reads. The fit
is in :mod:`autoplan.calibrate.fit`; it never imports torch.
"""

from autoplan.calibrate.fit import CalibrationResult, RunComparison, calibrate, compare_run

__all__ = ["CalibrationResult", "RunComparison", "calibrate", "compare_run"]
