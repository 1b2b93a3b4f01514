"""`reprogate promote`: production changes only as a git commit a reviewer can read."""
