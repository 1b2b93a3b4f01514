"""The pipeline's stages, one module each: a declaration (PER_MODEL, dvc()) and run().

Stages never import each other; what two need lives in a package below. pipeline/runner.py is
the registry of their names.
"""
