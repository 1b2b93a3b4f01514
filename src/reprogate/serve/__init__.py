"""`reprogate serve`: the production model over HTTP."""
