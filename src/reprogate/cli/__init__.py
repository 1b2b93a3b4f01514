"""The command line: thin commands over the packages below."""
