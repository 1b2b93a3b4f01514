"""Loading what was gated: calibration, the production record, shipped files."""
