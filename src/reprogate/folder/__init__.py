"""The model folder, models/<m>/, below every kind and stage that writes or reads one: read
files.py (its layout, writing it, its version, its calibration), then scorer.py (a classifier's
folder opened for scoring). Importing this package imports neither."""
