"""The files one stage writes and another reads, one pydantic model each, one module per stage.

This package's __init__ imports nothing: a stage depends (in dvc.yaml) on the records it reads and
writes, so a field added to the gate's decision never reruns a training stage. base.py says what a
record is (write, load, parse); each module holds a stage's complete record and, beside it, the
headline DVC shows (`dvc metrics show` prints one column per number; the complete records hold the
rest, and each headline is derived from its record by the stage that writes both).

module: file (model) -- written by -> read by
- data: results/data.json (DataRecord), metrics/data.json (DataMetrics) -- prepare -> promote
- augment: metrics/augment.json (AugmentRecord) -- augment -> dvc metrics
- train: models/<m>/config.json (ModelConfig), fingerprint.json (Fingerprint), metrics/<m>/train.json
  (TrainRecord, CombineRecord) -- train, combine -> model_folder, promote, report
- export: metrics/<x>/export.json (ExportRecord) -- export -> gate, report
- calibration: models/<m>/calibration.json (CalibrationRecord) -- calibrate -> evaluate, promote
- evaluation: results/<m>/eval.json (Evaluation), metrics/<m>/eval.json (EvalMetrics),
  predictions/<m>/<set>.jsonl (PredictionLine) -- evaluate -> gate, promote, report, registry
- resume: results/<m>/resume.json (ResumeRecord), metrics/<m>/resume.json (ResumeMetrics)
  -- resume_check -> gate, report
- gate: results/gate.json (Decision), metrics/gate.json (GateMetrics) -- gate -> promote, report
- production: models/production.json (ProductionRecord), <git dir>/reprogate/promotion.json
  (PromotionJournal) -- promote -> gate, predict, serve; promote after a kill
- runlog: logs/<stage>.jsonl (RunLogEntry), runs/<m>/updates/<k>.jsonl (UpdateLine) -- every timed
  stage -> people, the registry

A language model's records are in lm.py, the numeric fingerprint of a machine in numerics.py, and
a whole revision's records as one object (the report, verify, the registry) in revision.py.
"""
