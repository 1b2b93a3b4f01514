"""The DVC pipeline: the stage context, the stage registry and stages, compile, verify, remote."""
