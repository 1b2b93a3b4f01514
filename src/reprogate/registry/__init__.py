"""`reprogate registry`: runs, metrics and predictions in Delta Lake tables, queried by SQL."""
