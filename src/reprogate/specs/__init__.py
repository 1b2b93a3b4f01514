"""Every spec kind, one module each, and the loader that reads them.

Read them in this order: base (shared types), data, text, lm, model, gate, params, reading
(bounded YAML), roots (where a spec may reach), loader (one file of a known kind, the pipeline of
params.yaml), catalog (a file of any kind: validate and schema).

This __init__ imports nothing: a stage's dvc.yaml dependencies are the modules it imports, and a
package that re-exported every kind would make the gate's thresholds a dependency of training.
"""
