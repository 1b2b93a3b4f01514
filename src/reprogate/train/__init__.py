"""Training: the trainer, full-state checkpoints, ranks (torchrun, Ray), plans, model folders."""
