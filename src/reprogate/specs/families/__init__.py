"""The built-in model families, one declaration each (specs/family.py says what a declaration
holds and how a spec's `family:` finds one). This __init__ imports none of them: a spec imports
the family it names, so one family's declaration is never another family's dependency."""
