"""`reprogate report`: the pull-request report."""
